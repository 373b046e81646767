from alphabet_sort.taskset import AlphabetSortEnv, AlphabetSortTaskset

__all__ = ["AlphabetSortEnv", "AlphabetSortTaskset"]
