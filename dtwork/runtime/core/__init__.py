"""A rank's state and its ground floor: state, group, control, publish, timing, argument checks. Imports no other runtime folder."""
