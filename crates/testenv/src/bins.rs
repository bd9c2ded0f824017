//! Locating the upstream binaries.
