from color_codeword.taskset import ColorCodewordEnv, ColorCodewordTaskset

__all__ = ["ColorCodewordEnv", "ColorCodewordTaskset"]
