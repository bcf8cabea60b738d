"""The drafters' names and the default draft length, in a module that imports no llama.cpp: the
CLI and the server check a drafter's name (and `--help` shows the default) before any model is
loaded."""

from enum import Enum

FIXED_GAMMA = 4  # draft length of a fixed drafter when none is given


class Drafter(str, Enum):
    """What proposes the draft tokens. A str, so it compares equal to, and prints and serializes
    as, its plain name ("auto", ...)."""

    AUTO = "auto"  # chooses n-gram, model, MTP or nothing each step by measured costs
    MODEL = "model"  # the draft model
    MTP = "mtp"  # the target's own multi-token-prediction layers
    NGRAM = "ngram"  # copies what followed the same words earlier in the text
    NONE = "none"  # target only

    def __str__(self) -> str:  # Python 3.12's Enum.__format__ would say "Drafter.AUTO"
        return self.value
