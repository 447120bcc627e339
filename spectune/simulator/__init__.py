"""SimPy discrete-event model of a continuously batching server with speculative decoding."""
