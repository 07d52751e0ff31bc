"""Generated convolution kernel families: direct (docs/DIRECTCONV.md), depthwise
(docs/DWCONV.md) and Winograd (docs/WINOGRAD.md), their shared geometry and launchers."""
