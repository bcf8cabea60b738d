"""The exception types the library raises for problems a user can fix. The CLI turns each into a
single clear line and a non-zero exit code, the server into an HTTP 4xx. Their messages are true
for any caller: the subclasses below carry what a caller needs to add its own hint (the CLI names
its flags, the server its request fields)."""

import math
from numbers import Integral, Real


class SpecllmError(Exception):
    """A problem the user can fix: bad input, a missing file, an incompatible model pair."""


class Terminated(BaseException):
    """SIGTERM, or SIGHUP (the terminal closed), raised in the main thread like KeyboardInterrupt
    so that everything unwinds on the way out (Rich's live view shows the cursor again, temporary
    files go, a chat saves its conversation), but not caught where an interrupt is (chat goes on
    after Ctrl-C, not after SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Interrupted(Exception):
    """A generation was cancelled (Generation.cancel) while its prompt was evaluated: the prefill
    stopped within a batch (on a CPU) or between two. Not a user's mistake: the generation ends
    cut short."""


class ContextFull(SpecllmError):
    """The prompt leaves no room in the context for a token to be generated."""

    def __init__(self, prompt_tokens: int, n_ctx: int, what: str = "the prompt", detail: str = ""):
        super().__init__(f"{what} is {prompt_tokens} tokens{detail} but the context holds {n_ctx}")
        self.prompt_tokens, self.n_ctx, self.what = prompt_tokens, n_ctx, what


class ContextTooLarge(SpecllmError):
    """A context whose KV cache would not fit in the memory available: refused before llama.cpp
    allocates it, since the system would end the process as llama.cpp filled it. `fits`: the
    largest context size that fits (0: none)."""

    def __init__(self, message: str, *, n_ctx: int, fits: int):
        super().__init__(message)
        self.n_ctx, self.fits = n_ctx, fits


class NeedsDraftModel(SpecllmError):
    """Drafter "model" was asked for, and there is no draft model: the pair named has none, or (for
    a target given alone, `none_fits` its name) no file on disk fits it."""

    def __init__(self, pair: str | None = None, *, none_fits: str | None = None):
        if pair:
            message = f"pair {pair} has no draft model"
        elif none_fits:
            message = (
                f"drafter 'model' needs a draft model, and none on disk fits {none_fits} "
                f"(`specllm models --drafts-for {none_fits}` lists why)"
            )
        else:
            message = "drafter 'model' needs a draft model"
        super().__init__(message)
        self.pair, self.none_fits = pair, none_fits


class NoMtpLayers(SpecllmError):
    """Drafter "mtp" was asked for, and the target has no MTP (nextn) layers."""

    def __init__(self, target_name: str):
        super().__init__(f"drafter 'mtp' needs a target with MTP layers (nextn), and {target_name} has none")


class GammaTooLong(SpecllmError):
    """A draft length whose verify call (gamma + 1 tokens) does not fit in one batch."""

    def __init__(self, gamma: int, n_batch: int):
        super().__init__(
            f"gamma (draft length) {gamma} is too long: a verify call holds at most {n_batch} tokens "
            f"(the batch size), so gamma must be at most {n_batch - 1}"
        )
        self.gamma, self.n_batch = gamma, n_batch


class DraftTooLong(SpecllmError):
    """A fixed draft length longer than the recurrent-state snapshots a hybrid target keeps to take
    back rejected tokens."""

    def __init__(self, gamma: int, snapshots: int, target_name: str, snapshot_bytes: int):
        super().__init__(
            f"gamma (draft length) {gamma} is longer than the {snapshots} recurrent-state snapshots "
            f"{target_name} keeps to take back rejected tokens"
        )
        self.gamma, self.snapshots, self.snapshot_bytes = gamma, snapshots, snapshot_bytes


class CannotTakeBack(SpecllmError):
    """A fixed drafter on a recurrent target, with a llama-cpp-python too old to take rejected
    draft tokens back out of its recurrent state."""


class NotDownloaded(SpecllmError):
    """A model file is needed that is not downloaded yet, and offline mode is on."""

    def __init__(self, label: str):
        super().__init__(f"{label} is not downloaded yet, and offline mode is on")
        self.label = label


class NoMirror(SpecllmError):
    """The package-index mirror was asked for a file it does not hold."""

    def __init__(self, label: str):
        super().__init__(f"no mirror is known for {label}")
        self.label = label


class Incompatible(SpecllmError):
    """A draft whose vocabulary differs from its target's; `reason` says how (the message also
    names both files)."""

    def __init__(self, target_name: str, draft_name: str, reason: str):
        super().__init__(f"{draft_name} cannot draft for {target_name}: {reason}")
        self.reason = reason


class DraftNotLoaded(SpecllmError):
    """A deferred draft model could not be loaded when a generation first needed it: its file
    went missing or bad after the engine was loaded, or its context does not fit in the memory
    left (the message is the load's own; `cause` the load's error, for the hint a caller adds)."""

    def __init__(self, cause: SpecllmError):
        super().__init__(str(cause))
        self.cause = cause


class ChatTemplateFailed(SpecllmError):
    """The model's chat template could not render a conversation: damaged, or it failed (a syntax
    error, an error it raised, a rendering past its bounds)."""


class GrammarInvalid(SpecllmError):
    """A grammar (GBNF) that llama.cpp cannot parse, or a JSON schema that cannot be turned into one."""


class CallLikeAnswer(SpecllmError):
    """Tools offered beside a grammar whose answers may begin as a tool call does: a reply could
    not be told to be one or the other."""


class LogitsNotFinite(SpecllmError):
    """A model's logit row holds no finite number, or +inf: llama.cpp's computation broke down
    (damaged weights, or an overflow in its backend's kernels), and nothing chosen from it would
    mean anything. `model` says which, where the caller knows."""

    def __init__(self, model: str = "the model"):
        super().__init__(
            f"{model} gave logits that are not finite numbers (NaN or infinite): llama.cpp's "
            "computation broke down, from damaged weights or an overflow in its backend's kernels"
        )
        self.model = model


def whole_number(name: str, value) -> int:
    """value as an int, if it is one (a bool is not): options given from Python are checked as the
    command line checks its flags."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise SpecllmError(f"{name} must be a whole number, got {value!r}")
    return int(value)


def real_number(name: str, value) -> float:
    """value as a float, if it is a number (a bool is not); one beyond a float's range (the int
    10**400) is infinite, as the command line reads "1e400", and is refused by the same check."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise SpecllmError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        return -math.inf if value < 0 else math.inf
