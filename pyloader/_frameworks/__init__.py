"""What the loader hands to frameworks: torch devices and pinning, TensorFlow, progress bars."""
