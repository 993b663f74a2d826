//! Planned placement (issue 33): training asks for the same tensors in the same order every
//! iteration, so their addresses can be planned instead of found. This module holds the pure parts,
//! with no allocator state:
//!
//! - `placement`: offsets for blocks whose lifetimes are known, in one address range, so that no
//!   two blocks live at the same time overlap; several greedy planners and the best of them, for a
//!   straight stretch of time or for a step that repeats (cyclic lifetimes, which may run into the
//!   next repetition). Its bound is the floor: the most bytes ever live at once.
//! - `period`: the repeating sequence in a stream of requests (an iteration), found with no hint.
//! - `log`: the online planner's record of the latest allocations, a ring by allocation number.
//! - `online`: the planner the allocator consults while a program runs (`planned_placement`): it
//!   finds the step, plans it, and says where each request goes.

mod log;
pub mod online;
pub mod period;
pub mod placement;
