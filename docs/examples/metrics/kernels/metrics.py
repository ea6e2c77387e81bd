"""Metrics over a batch of logits: the kernels of docs/pipeline.md's `inputs:` example."""

# ruff: noqa: F821  (Tensor["B", "C"] names symbolic dims, bound by pipeline.yaml's shapes)

import kiln
from kiln import Tensor, device


@device
def top1_accuracy(logits: Tensor["B", "C"], labels: Tensor["B"]):
    """The fraction of rows whose largest logit is at the row's label (a class index)."""
    predicted = kiln.cast(kiln.argmax(logits, axis=-1), "f32")
    return kiln.cast(kiln.equal(predicted, labels), "f32").mean()


@device
def log_softmax(logits: Tensor["B", "C"]):
    """log(softmax(logits)) along each row."""
    return kiln.log_softmax(logits, axis=-1)
