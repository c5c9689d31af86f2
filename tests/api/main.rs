//! The integration test binary: one binary, one module per area.

mod db;
mod store;
