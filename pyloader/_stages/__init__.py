"""The stages of the pipeline, in the order a batch crosses them (see ``pyloader._pipeline``)."""
