"""NumPy reference kernels, one file per op (``op_<snake_name>.py``), plus shared per-family helpers."""
