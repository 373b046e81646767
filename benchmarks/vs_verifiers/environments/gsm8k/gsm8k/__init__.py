from gsm8k.taskset import GSM8KTaskset

__all__ = ["GSM8KTaskset"]
