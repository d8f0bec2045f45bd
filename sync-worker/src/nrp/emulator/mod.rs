//! NRP emulator (in progress).
