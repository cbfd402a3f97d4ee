//! The lease mode: the client crate's pure lease logic behind the simulator's `ClientModel`.

use crate::scenarios::LeaseFactory;

/// The factory of lease models; `None` until the client crate's logic is wired in.
pub fn factory() -> Option<Box<LeaseFactory>> {
    None
}
