"""goodput: keeps large PyTorch training jobs productive."""
