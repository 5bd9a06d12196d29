"""The size limits every stage shares (the IR, the elaborator, the command line's options).

Kept apart from the IR (``terms``, which re-exports them) so that the command line can build
its parser, and answer ``--help``, without loading the IR's classes.
"""

__all__ = ["MAX_AXIS_SIZE", "MAX_INDEX_INT", "MAX_MESH_DEVICES"]

#: the largest axis size or tile (2^53: every size and product of a few stays exact in
#: float64, where the cost model and the tile search compute)
MAX_AXIS_SIZE = 1 << 53

#: the most devices a mesh may have (``--mesh``, a hardware profile's ``devices``): 2^16, past
#: the largest machines JAX runs one program on (multislice TPU jobs of about 50,000 chips); the
#: emitted code's size does not grow with it (the ring's permutation is computed)
MAX_MESH_DEVICES = 1 << 16

#: the largest integer an index expression may write (int64's largest): positions and index
#: arithmetic are 64-bit integers (``evaluate._index``, which wraps past it as the finiteness
#: analysis assumes: ``finiteness.INDEX``), so a larger literal has no value there
MAX_INDEX_INT = (1 << 63) - 1
