//! Memory dependencies (in progress)
