"""Discardable attribute names shared by several passes and readers, defined once.

Attributes a single module owns stay with it (``sharding.strategy`` with the
sharding dialect, ``alpa.aliases`` with the importer, ...); these are the
ones several modules read or write.
"""

BATCH_ATTR = "alpa.batch_args"
"""@main (and stage function) attribute: flat indices of the inputs that are
the batch (split into micro-batches)."""
PER_MICRO_BATCH_ATTR = "pipeline.per_micro_batch"
"""On forward/backward functions: the results that depend on the batch. When
such a result is accumulated, the driver takes its mean over micro-batches;
the other results are the same for every micro-batch and are taken once."""
CONCATENATED_ATTR = "pipeline.concatenated_results"
"""@main attribute: the indices of its results that are batch-shaped (a
micro-batch's result is a slice of the whole batch's along axis 0, Alpa's
"concatenated" outputs): the driver concatenates them over the micro-batches
instead of taking their mean."""
ACCUMULATED_ATTR = "alpa.accumulated_results"
"""On a layer range's function: the indices of its results accumulated over
the micro-batches (read only by apply-grad, or returned by the step: the
gradients, the loss), whose reductions over the mesh the runtime defers to
once per step (``deferred_reductions``)."""
CROSS_BYTES_ATTR = "pipeline.cross_bytes"
"""Transfer attribute: bytes crossing between the meshes (i64)."""
PROPAGATED_ATTR = "sharding.propagated"
"""Function attribute (unit): its specs were chosen by XLA's sharding
propagation, not by the ILP (``enable_auto_sharding=False``); the backend
compiles such a function with those specs alone."""
GROUP_ATTR = "sharding.group"
"""Op attribute: the ILP node (group of ``merge-trivial-ops``) the op belongs to."""
TIME_ATTR = "p2.predicted_time"
"""Predicted seconds of collectives: on a logical mesh (its module's
collectives on its placement) or on a reduction op (its chosen program)."""
