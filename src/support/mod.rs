//! Small helpers with no knowledge of the product's layers: the host's clock, random
//! identifiers and their hex, and the shutdown handle every background task is handed.

pub mod clock;
pub mod ids;
pub mod shutdown;
