"""Grammar states through beam search's reassignment of beams.

Each step beam search says which running beam each of the next beams continues (`parents`) and
with which token; beam i's grammar must then be its parent's state advanced by that token. Every
new state is taken from the parents' states as they were before the step: a parent continued by
one beam hands that beam its state itself, one continued by several gives each further beam a
`fork()` (made before any of them advances), and a parent nobody continues is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from refengine.guided.state import GrammarState


def follow_parents(states: Sequence[GrammarState], parents: Sequence[int], tokens: Sequence[int]) -> list[GrammarState]:
    """The grammar state of each next beam: its parent's, advanced by its token."""
    claimed: set[int] = set()
    taken = []
    for parent in parents:
        taken.append(states[parent].fork() if parent in claimed else states[parent])
        claimed.add(parent)
    for state, token in zip(taken, tokens):
        # The mask gave a refused token -inf: such a candidate is picked only when fewer than the
        # beam width of valid ones exist, and its beam can never become a valid answer.
        if not state.accept(token):
            state.dead()
    return taken
