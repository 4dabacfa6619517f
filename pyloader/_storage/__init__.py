"""Bytes from storage: local and remote files, read-ahead, caches, decompression, on-disk formats."""
