# The sampler chain in C (_sampler.c), built by setup.py where a C compiler is found.
import numpy as np

SOURCE_SHA256: str  # of the _sampler.c it was built from

def candidates(
    row: np.ndarray, ids: np.ndarray, p: np.ndarray, top_p: float, min_p: float, temperature: float, /
) -> int: ...
def draw(p: np.ndarray, u: float, /) -> int: ...
def top_probability(row: np.ndarray, token: int, window: float, below: float, /) -> float: ...
