"""nmt: an LSTM encoder-decoder translation toolkit for studying attention."""

__version__ = "0.1.0"
