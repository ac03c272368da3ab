"""The reference's weights handed to a candidate while it is being built, wherever in its module tree they live.

What a candidate's `__init__` derives from its weights (a constant folded in place, a pre-transposed copy) must be
derived from the weights it is checked with, so each weight has to take the checked value at the moment it is
created, before anything reads it. Top-level assignments in `ModelNew.__init__` are easy: their names are the
state_dict's. A weight created deeper (inside a submodule class of the submission's own, which folds it in its own
`__init__` before `ModelNew` ever sees the submodule; or on a module appended to a container already attached) has
no name yet when it is created. So the construction is recorded once: every assignment of a tensor or module, every
`torch.nn.init` call, in order, each resolved after the build to the state_dict entry it became. A second build
from the same seed replays the same sequence and hands each entry over at its event: the tensor when it is
assigned and again right after a `torch.nn.init` call re-initialises it (a built-in module's `reset_parameters`
runs after the assignment), a module's remaining entries when it is attached. An event sequence that differs
from the recorded one (a construction that is not deterministic) stops the replay where it differs; whatever was
not handed over is loaded after the build, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# torch.nn.init's in-place initialisers (uniform_, kaiming_uniform_, ...): what a built-in's reset_parameters calls
INIT_FUNCTIONS = tuple(name for name in dir(torch.nn.init) if name.endswith("_") and not name.startswith("_")
                       and callable(getattr(torch.nn.init, name)))


@dataclass(frozen=True)
class Event:
    kind: str  # "tensor": a tensor assigned or registered; "module": a module attached; "init": torch.nn.init call
    owner: str  # the owner module's class name ("" for an init call)
    name: str  # the attribute the value was assigned to ("" for an init call)


@dataclass(frozen=True)
class HandoverPlan:
    events: tuple[Event, ...]
    keys: tuple[str | None, ...]  # each event's state_dict entry (a module's prefix); None: not in the built model
    submission_owned: frozenset[str] = frozenset()  # entries created under a module class the submission defines

    def worth_replaying(self, state: dict, delivered: set[str]) -> bool:
        """Whether a replayed build would hand over something the top-level handover could not: an entry created
        under one of the submission's own module classes, or one it never reached (appended to a container)."""
        entries = {key for key, event in zip(self.keys, self.events) if key in state and event.kind == "tensor"}
        return bool(entries & self.submission_owned or entries - delivered)


@dataclass
class _Recorded:
    event: Event
    owner: object  # the module the value was assigned on, or the tensor an init call re-initialised
    name: str
    value: object  # kept alive, so that no later object takes its id during the build


@dataclass
class Construction:
    """A context manager around `cls(...)`: records every event, and hands `state` over. Without a `plan`, only at
    `cls`'s own first assignment of each name (a second assignment is derived from the first); with one, at every
    event of the plan (see the module's docstring). After the build, `plan_for(model)` resolves the record."""

    state: dict
    cls: type
    plan: HandoverPlan | None = None
    delivered: set = field(default_factory=set)
    aligned: bool = True
    _record: list = field(default_factory=list)
    _anchors: dict = field(default_factory=dict)  # id(tensor) → index of the event that assigned it
    _first: dict = field(default_factory=dict)  # state entry → id of the tensor it was handed to first
    _assigned: set = field(default_factory=set)
    _inside_setattr: bool = False
    _saved: dict = field(default_factory=dict)  # torch.nn.Module's methods, put back on exit
    _saved_init: dict = field(default_factory=dict)  # torch.nn.init's initialisers, put back on exit

    def __enter__(self):
        module = torch.nn.Module
        self._saved = {"__setattr__": module.__setattr__, "register_buffer": module.register_buffer,
                       "register_parameter": module.register_parameter, "add_module": module.add_module}
        self._saved_init = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}
        construction = self
        saved = self._saved

        def setattr_hook(owner, name, value):
            construction._inside_setattr = True
            try:
                saved["__setattr__"](owner, name, value)
            finally:
                construction._inside_setattr = False
            construction._assigned_on(owner, name, value)

        def register_buffer_hook(owner, name, tensor, *args, **kwargs):
            saved["register_buffer"](owner, name, tensor, *args, **kwargs)
            construction._assigned_on(owner, name, tensor)

        def register_parameter_hook(owner, name, param):
            saved["register_parameter"](owner, name, param)
            if not construction._inside_setattr:  # __setattr__ registers its parameters through here
                construction._assigned_on(owner, name, param)

        def add_module_hook(owner, name, child):
            saved["add_module"](owner, name, child)
            construction._assigned_on(owner, name, child)

        module.__setattr__ = setattr_hook
        module.register_buffer = register_buffer_hook
        module.register_parameter = register_parameter_hook
        module.add_module = add_module_hook
        for name, function in self._saved_init.items():
            setattr(torch.nn.init, name, self._init_hook(function))
        return self

    def __exit__(self, *exc):
        for name, function in self._saved.items():
            setattr(torch.nn.Module, name, function)
        for name, function in self._saved_init.items():
            setattr(torch.nn.init, name, function)
        return False

    def _init_hook(self, function):
        def initialise(tensor, *args, **kwargs):
            result = function(tensor, *args, **kwargs)
            if isinstance(tensor, torch.Tensor):
                self._event(Event("init", "", ""), tensor, "", tensor)
            return result

        initialise.__wrapped__ = function
        return initialise

    def _assigned_on(self, owner, name, value) -> None:
        if isinstance(value, torch.nn.Module):
            self._event(Event("module", type(owner).__name__, name), owner, name, value)
        elif isinstance(value, torch.Tensor):
            self._anchors[id(value)] = len(self._record)
            self._event(Event("tensor", type(owner).__name__, name), owner, name, value)

    def _event(self, event: Event, owner, name: str, value) -> None:
        index = len(self._record)
        self._record.append(_Recorded(event, owner if event.kind != "init" else value, name, value))
        if self.plan is None:
            self._top_level(owner, name, value)
        elif self.aligned:
            if index >= len(self.plan.events) or self.plan.events[index] != event:
                self.aligned = False  # the construction took another path: hand nothing more over
                return
            self._replayed(event, self.plan.keys[index], value)

    def _top_level(self, owner, name: str, value) -> None:
        if type(owner) is not self.cls or name in self._assigned:
            return
        if isinstance(value, (torch.nn.Module, torch.Tensor)):
            self._assigned.add(name)
        if isinstance(value, torch.nn.Module):
            self._hand_module(value, name, again=True)
        elif isinstance(value, torch.Tensor) and name in self.state and self.state[name].shape == value.shape:
            self._hand_tensor(value, name)

    def _replayed(self, event: Event, key: str | None, value) -> None:
        if key is None:
            return
        if event.kind == "module":
            # A built-in module is complete when it is attached (its reset_parameters has run) and derives nothing
            # itself: everything under it takes the state's values now, before its new owner reads them. A module
            # class of the submission's may have derived something in its own __init__ from entries already
            # handed over: only the others are copied.
            self._hand_module(value, key, again=_built_in(value))
            return
        if key not in self.state or self.state[key].shape != value.shape:
            return
        if event.kind == "tensor":
            if key in self._first:
                return  # assigned again: derived from the first, which was handed over
            self._first[key] = id(value)
        elif self._first.get(key) != id(value):
            return  # an init call on something else than the tensor the entry was handed to
        self._hand_tensor(value, key)

    def _hand_tensor(self, tensor: torch.Tensor, key: str) -> None:
        with torch.no_grad():
            tensor.copy_(self.state[key])
        self.delivered.add(key)

    def _hand_module(self, module: torch.nn.Module, path: str, *, again: bool) -> None:
        """The state's entries under `path` into `module`; `again`: also those already handed over."""
        prefix = path + "."
        own = {k[len(prefix):]: v for k, v in self.state.items()
               if k.startswith(prefix) and (again or k not in self.delivered)}
        self.delivered.update(prefix + entry for entry in copy_matching(module, own))

    def plan_for(self, model: torch.nn.Module) -> HandoverPlan:
        """The record resolved against the built model: each event's state_dict entry (None where the object is
        not in the model any more), and which entries were created under a module class of the submission's."""
        paths = {id(module): path for path, module in model.named_modules(remove_duplicate=False)}
        # modules of the submission's own classes below the model: what is created under them may be derived
        # from in their __init__, before the model's top-level handover reaches it
        own_classes = [path for path, module in model.named_modules(remove_duplicate=False)
                       if path and not _built_in(module)]
        keys: list[str | None] = []
        submission_owned = set()
        for recorded in self._record:
            owner, name = recorded.owner, recorded.name
            if recorded.event.kind == "init":
                anchor = self._anchors.get(id(recorded.owner))
                if anchor is None:
                    keys.append(None)
                    continue
                owner, name = self._record[anchor].owner, self._record[anchor].name
            path = paths.get(id(owner))
            key = None if path is None else (f"{path}.{name}" if path else name)
            keys.append(key)
            if key is not None and any(key.startswith(path + ".") for path in own_classes):
                submission_owned.add(key)
        return HandoverPlan(events=tuple(r.event for r in self._record), keys=tuple(keys),
                            submission_owned=frozenset(submission_owned))


def _built_in(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("torch.")


def copy_matching(module: torch.nn.Module, state: dict) -> list[str]:
    own = module.state_dict()
    copied = []
    with torch.no_grad():
        for key, value in state.items():
            if key in own and own[key].shape == value.shape:
                own[key].copy_(value)
                copied.append(key)
    return copied
