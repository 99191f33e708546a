"""The plain-PyTorch reference backend: the definition every other backend is tested against."""
