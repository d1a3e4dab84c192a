//! Hostile input: files and paths built to hang, exhaust or mislead dynrt, each of which must
//! be refused quickly with a typed error that says what is wrong. One module per area.

mod io;
