//! The embedded durable backend (being written).
