"""GPU tests: every module here marks itself ``gpu`` and skips without CUDA."""
