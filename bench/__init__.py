"""`make bench`: the runtime's figures (see README, "make bench"). Run as `python -m bench`."""
