"""The quality autopilot: score every checkpoint against the base, pick the checkpoint and the strength,
and stop the meter when the scores stop getting better (docs/quality.md).

Where each part lives:

- ``holdout``: which subject images are kept out of training as references (or why none);
- ``prompts``: the scoring prompts (the trigger in new scenes; prompts without it for leakage);
- ``scorers``: the scorer models (CLIP or SigLIP, DINOv2, dlib's face descriptor, imagehash's pHash),
  loaded from the Hub on the machine that trains or from a folder, each naming itself;
- ``measure``: the numbers of one checkpoint from its images and the base's at the same seeds;
- ``llm``: an LLM checkpoint's numbers (held-out loss, answers against the references);
- ``decide``: the composite score, the pick and the stop rule, pure functions of the records;
- ``autopilot``: what the engine (and the trainer runner) call at each checkpoint: score, record in
  the run folder (rundir/quality.py), decide, and say whether to stop.

Every score is a difference from the base model at the same seed and prompt. The scorers run where
the checkpoint is made, during training; with none available the run says so and the autopilot is
off: no number is ever made up.
"""
