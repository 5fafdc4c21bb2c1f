"""What the dry run (``porter.aot.dry_run``) remembers between calls, and what it leaves
behind: sizes kept only where every call of a program agrees on them, the writes to an
object a call writes replayed into the next such object, and nothing its meta run
cached on the modules."""

from porter.aot import programs


def test_sizes_that_differ_between_calls_of_a_program_are_data():
    """A program's calls merged: a grid's sizes, the same in each, stay; a timestep's,
    another each step, are dropped (one program serves every step); a chunk's cache
    (a tuple of its own class) keeps its class."""
    import torch

    from porter.shims.carried import Cache

    def call(step):
        args = (Cache([torch.zeros(2, 3)]),)
        kwargs = {"grid": torch.tensor([[2, 3, 4]]), "timestep": torch.tensor([step])}
        return programs.Program("transformer", "forward", programs.described(args),
                                programs.described(kwargs))

    [merged] = programs.unique([call(999), call(500)])
    assert merged.calls == 2 and isinstance(merged.args[0], Cache)
    assert merged.kwargs["grid"].sizes.values == (2, 3, 4)
    assert merged.kwargs["timestep"].sizes is None
    [one] = programs.unique([call(999), call(999)])
    assert one.kwargs["timestep"].sizes.values == (999,)


def test_the_meta_run_leaves_no_cache_on_the_modules():
    """What a model caches on itself while the dry run runs it on shapes (tables by the
    sizes they were made for) is put back: the compile traces the same modules."""
    import torch

    from porter.aot.dry_run import _cached_on

    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    module[0].tables, module[0].order = {"kept": 1}, [1]
    restore = _cached_on(module)
    module[0].tables[(2, 2)] = torch.empty(2, device="meta")
    module[0].order.append(2)
    module[0].made = {"new": torch.empty(2, device="meta")}
    module[0].freqs = torch.empty(2, device="meta")
    tables = module[0].tables
    restore()
    assert module[0].tables == {"kept": 1} and module[0].tables is tables
    assert module[0].order == [1]
    assert not hasattr(module[0], "made") and not hasattr(module[0], "freqs")
    assert module[0].weight.shape == (2, 2)


def test_a_call_that_changes_its_objects_structure_is_never_answered_from_memory():
    """The dry run answers a call like an earlier one from memory, writing what the
    earlier call wrote into the new object; a call that changed its object's structure
    (a run splits it) is run again each time, its writes fitting no object of the old
    structure."""
    import torch

    from porter.aot.dry_run import _answered

    class Cache:
        def __init__(self):
            self.key, self.sink = None, None

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.runs = 0

        def forward(self, x, cache=None, grow=False):
            self.runs += 1
            cache.key = self.proj(x)
            if grow:
                cache.sink = (x, x)  # a slot becomes a tuple: its structure changes
            return x

    model = Model().to("meta")
    with _answered({"transformer": model}, {}, {}) as calls:
        for grow in (False, False, True, True):
            cache = Cache()
            model(torch.zeros(1, 4), cache=cache, grow=grow)
            assert cache.key is not None and cache.key.shape == (1, 4)
            assert (cache.sink is not None) == grow
    assert len(calls) == 4
    assert model.runs == 3  # the second call answered from memory, its write replayed
