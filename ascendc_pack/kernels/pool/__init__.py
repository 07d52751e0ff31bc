"""Generated pooling kernels (:mod:`.maxpool`)."""
