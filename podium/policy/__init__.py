"""Policies at serving time: versioned weight artifacts and the hot-swapping holder."""
