"""Tests that need a CUDA GPU (CuPy and a device): each module is marked `gpu` and skips without one.
`pytest -m gpu tests` runs them, with the GPU tests in other files, on any GPU machine."""
