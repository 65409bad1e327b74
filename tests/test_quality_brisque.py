"""Why no-reference aesthetic scores do not decide (quality/decide.py): BRISQUE, measured with the
``brisque`` package (0.2.0, its own SVM weights), rates an over-smoothed photo better than the photo.

A photo with grain (scikit-image's astronaut with sensor-like noise, sigma 12) against the same photo
through an edge-preserving smoothing (OpenCV's bilateral filter): the "plastic skin" of an over-fit
LoRA. BRISQUE (lower is "better") prefers the smoothed one, by a wide margin (Fizgig #47 reports the
same of generated faces). The autopilot's decision reads likeness to held-out references instead
(tests/test_quality_traps.py). Skipped without brisque, OpenCV and scikit-image; brisque 0.2.0 needs
numpy < 2.4 (its feature code divides by a shape tuple), so it runs in its own environment:

    python -m venv .venv-brisque
    .venv-brisque/bin/pip install "numpy<2.4" brisque==0.2.0 opencv-python-headless libsvm-official scikit-image pytest
    .venv-brisque/bin/python -m pytest -q -p no:cacheprovider --noconftest tests/test_quality_brisque.py
"""

from __future__ import annotations

import pytest


def test_brisque_rates_an_over_smoothed_photo_better():
    brisque = pytest.importorskip("brisque")
    cv2 = pytest.importorskip("cv2")
    data = pytest.importorskip("skimage.data")
    import numpy as np

    photo = data.astronaut().astype(np.float32)
    grain = np.clip(photo + np.random.default_rng(0).normal(0, 12, photo.shape), 0, 255).astype(np.uint8)
    smoothed = cv2.bilateralFilter(grain, 9, 60, 9)
    q = brisque.BRISQUE(url=False)
    try:
        with_grain, plastic = q.score(grain), q.score(smoothed)
    except TypeError as exc:  # brisque 0.2.0 under numpy >= 2.4
        pytest.skip(f"brisque cannot score under this numpy ({exc})")
    assert plastic < with_grain - 10  # measured: 12.3 against 31.4
