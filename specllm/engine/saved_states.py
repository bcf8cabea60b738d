"""Other conversations' KV caches, kept in memory for a server.

A server's KV cache holds one conversation: the last request's. A request with another prompt (a
client's side request for a title, or a second client) replaces it down to the prompts' common
start, and the first conversation's next turn would be prefilled again from there: 67.5 s for
4,000 tokens of the default target on the reference CPU, where saving its state takes 90 ms and
restoring it 12 ms. So before a prompt cuts a long context back, that context is saved; a prompt
that shares a longer start with a saved one than with the KV cache gets it back. The states are
kept least recently used first out, within a byte budget, as llama-server's --cache-ram keeps
its slots' prompts. Recurrent and hybrid models are not saved (Model.saved_state).
"""

from dataclasses import dataclass, field

from specllm.llama.model import Model, SavedState, common_prefix

WORTH_SAVING = 64  # tokens of context a prompt must cut away for the context to be saved
WORTH_RESTORING = 32  # tokens more a saved state must hold of a prompt than the KV cache does


@dataclass
class _Entry:
    states: dict[int, SavedState] = field(default_factory=dict)  # by the model's id()

    @property
    def tokens(self) -> list[int]:
        return next(iter(self.states.values())).tokens

    @property
    def size(self) -> int:
        return sum(state.size for state in self.states.values())


class SavedStates:
    """The saved contexts of the models given (a target and its draft), least recently used
    first out of `budget` bytes."""

    def __init__(self, budget: int):
        self.budget = budget
        self._entries: list[_Entry] = []  # the most recently used last

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def switch(self, prompt: list[int], target: Model, others: list[Model]) -> int:
        """Before `target` (and the `others` in step with it) evaluate `prompt`: save what the
        prompt would cut away, and restore the saved context that holds more of it. Returns the
        tokens of the prompt a restored state holds (0: none restored)."""
        kept = common_prefix(target.tokens, prompt)
        held, best = max(
            ((common_prefix(e.tokens, prompt), e) for e in self._entries), key=lambda pair: pair[0], default=(0, None)
        )
        if best is not None and held - kept >= WORTH_RESTORING:
            self._entries.remove(best)  # it lives in the KV cache again; saved anew when cut away
        else:
            best = None
        if len(target.tokens) - kept >= WORTH_SAVING:
            self._save([target, *others])
        if best is None or not target.restore(best.states[id(target)]):
            return 0
        for model in others:  # one that fails is emptied, and catches up by itself as ever
            if (state := best.states.get(id(model))) is not None:
                model.restore(state)
        return held

    def _save(self, models: list[Model]) -> None:
        entry = _Entry()
        for model in models:
            state = model.saved_state(limit=self.budget - entry.size)
            if state is not None:
                entry.states[id(model)] = state
        if id(models[0]) not in entry.states:
            return
        # a conversation saved before it grew is the start of this one
        self._entries = [e for e in self._entries if e.tokens != entry.tokens[: len(e.tokens)]]
        self._entries.append(entry)
        while self.size > self.budget:
            self._entries.pop(0)
