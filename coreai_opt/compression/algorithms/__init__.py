"""The encoders, one module an algorithm: each turns one weight into an `Encoding` (or says why
it cannot) for the config type `compression.registry` files it under. Nothing here is imported
until a weight is encoded (every module imports torch)."""
