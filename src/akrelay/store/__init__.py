"""Storage backends behind one interface (:mod:`akrelay.store.base`)."""
