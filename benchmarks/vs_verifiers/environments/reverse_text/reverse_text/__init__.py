from reverse_text.taskset import ReverseTextTaskset

__all__ = ["ReverseTextTaskset"]
