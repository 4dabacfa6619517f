"""Unit tests of the pipeline stages, one module per stage (pyloader/_stages/), each stage built alone."""
