//! SSH test hosts.
