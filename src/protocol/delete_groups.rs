//! (codec to be written)
