"""pipeline.yaml pieces that the temporary projects of several tests share."""

# the full stage table, as the example pipeline lists it
STAGES = """\
stages:
  - {name: trace, module: kiln.stages.trace}
  - {name: visa, module: kiln.stages.visa}
  - {name: lir, module: kiln.stages.lir}
  - {name: schedule, module: kiln.stages.schedule}
  - {name: edf, module: kiln.stages.edf}
"""
