"""PyTorch components (xser/torch/): state, ties, devices, optimizer state, flat views."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch tests need torch (the test extra installs it)")
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
import xser.torch as xt
from xser.storage.dtypes import DTYPES


@xser.serializable(tag="!TEncoder")
class Encoder(torch.nn.Module):
    vocab: int
    dim: int

    def __attrs_post_init__(self):
        self.emb = torch.nn.Embedding(self.vocab, self.dim)
        self.norm = torch.nn.BatchNorm1d(self.dim)
        self.register_buffer("scratch", torch.zeros(1000), persistent=False)  # never saved

    def forward(self, x):
        return self.norm(self.emb(x))


@xser.serializable(tag="!TDecoder")
class Decoder(torch.nn.Module):
    encoder: Encoder
    tie: bool = True
    extra: bool = False

    def __attrs_post_init__(self):
        dim, vocab = self.encoder.dim, self.encoder.vocab
        self.out = torch.nn.Linear(dim, vocab, bias=False)
        if self.tie:  # across components: the decoder's output layer is the encoder's embedding
            self.out.weight = self.encoder.emb.weight
        self.gate = xser.params(self).add("gate", (dim,), init="ones")
        self.count = xser.params(self).add("count", (), dtype=torch.int64, trainable=False)
        if self.extra:
            self.more = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.out(self.encoder(x) * self.gate)


@xser.serializable(tag="!TSeq2Seq")
class Seq2Seq(torch.nn.Module):
    encoder: Encoder
    decoder: Decoder

    def forward(self, x):
        return self.decoder(x)


@xser.serializable(tag="!TTiedLM")
class TiedLM(torch.nn.Module):
    """Tied inside one component: two plain submodules share one Parameter."""

    vocab: int = 7
    dim: int = 3

    def __attrs_post_init__(self):
        self.emb = torch.nn.Embedding(self.vocab, self.dim)
        self.proj = torch.nn.Linear(self.dim, self.vocab, bias=False)
        self.proj.weight = self.emb.weight


@xser.serializable(tag="!TAllDtypes")
class AllDtypes(torch.nn.Module):
    tags: list

    def __attrs_post_init__(self):
        p = xser.params(self)
        for tag in self.tags:
            floating = DTYPES[tag].average is not None and not tag.startswith("complex")
            p.add(f"t_{tag}", (2, 3), dtype=getattr(torch, tag), init="zeros", trainable=floating)


@xser.serializable(tag="!TShaped")
class Shaped(torch.nn.Module):
    dims: list
    dtype: str

    def __attrs_post_init__(self):
        xser.params(self).add("w", tuple(self.dims), dtype=getattr(torch, self.dtype), init="ones", trainable=False)
        self.lin = torch.nn.Linear(2, 3).to(getattr(torch, self.dtype) if self.dtype != "int8" else torch.float32)


def model(vocab=11, dim=4, **kw):
    enc = Encoder(vocab, dim)
    return Seq2Seq(enc, Decoder(enc, **kw))


def train(m, steps=3, seed=0, opt=None):
    g = torch.Generator().manual_seed(seed)
    opt = opt or torch.optim.Adam(m.parameters(), lr=0.01)
    for _ in range(steps):
        x = torch.randint(0, m.encoder.vocab, (8,), generator=g)
        loss = m(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return opt


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def data_files(path: str) -> dict[str, int]:
    d = Path(path + ".data")
    return {str(f.relative_to(d)): f.stat().st_size for f in d.rglob("*.npy")}


class TestState:
    def test_subcollections_follow_components(self, tmp_path):
        """Each component's subcollection is its state_dict minus serializable children; plain submodules count."""
        m = model()
        subs = {type(c).__name__: sorted(xser.params(c)) for c in (m.encoder, m.decoder)}
        assert subs == {
            "Encoder": ["emb.weight", "norm.bias", "norm.num_batches_tracked", "norm.running_mean", "norm.running_var",
                        "norm.weight"],
            "Decoder": ["count", "gate", "out.weight"],
        }
        assert xser.model.params.subcollection_of(m) is None  # no state of its own: no subcollection

    def test_batchnorm_statistics_survive_and_nothing_else_is_written(self, tmp_path):
        """Running statistics are saved; gradients, the non-persistent buffer and optimizer scratch are not:
        the data is exactly the parameters and persistent buffers, each tied tensor once."""
        m = model()
        train(m)
        assert m.encoder.emb.weight.grad is not None and m.encoder.norm.num_batches_tracked.item() == 3
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        unique = {id(t): t for t in m.state_dict(keep_vars=True).values()}
        payload = sum(t.numel() * t.element_size() for t in unique.values())
        files = data_files(path)
        headers = 128 * len(files)
        assert len(files) == len(unique) == 8 and sum(files.values()) == payload + headers
        back = xser.load(path)
        same_state(m, back)
        assert back.encoder.norm.num_batches_tracked.item() == 3 and back.encoder.emb.weight.grad is None

    def test_built_from_yaml(self, tmp_path):
        """Torch components configured in YAML build like any component; nn.Module.__init__ ran first."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text("exp:\n  model: !TSeq2Seq\n    encoder: !TEncoder {vocab: 5, dim: 2}\n    decoder: !TDecoder {encoder: !Ref {path: model.encoder}}\n")
        exp = xser.build(xser.load_config(cfg)["exp"])
        m = exp["model"]
        assert isinstance(m, torch.nn.Module) and m.decoder.encoder is m.encoder
        assert dict(m.named_children()).keys() == {"encoder", "decoder"}
        assert m(torch.tensor([1, 2])).shape == (2, 5)

    def test_parameter_rebound_to_a_tensor_in_a_numpy_component(self, tmp_path):
        """A numpy component whose parameter was rebound to a tensor: the save says so instead of dropping it."""
        from components import Linear

        lin = Linear(2, 3)
        lin.W = torch.zeros(3, 2)
        with pytest.raises(xser.DataError) as info:
            xser.save(lin, str(tmp_path / "m.yaml"))
        assert str(info.value) == (
            f"{xser.params(lin).name}: param 'W': attribute .W holds a torch.Tensor now, not the parameter's numpy array; "
            "update it in place (obj.W[...] = new) or with xser.params(obj)['W'] = new"
        )

    def test_meta_tensors_cannot_be_saved(self, tmp_path):
        m = TiedLM().to("meta")
        with pytest.raises(xser.DataError, match="emb.weight: the tensor is on the meta device and has no data to save"):
            xser.save(m, str(tmp_path / "m.yaml"))
        assert not (tmp_path / "m.yaml").exists()


class TestTies:
    def test_tied_inside_one_component(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = TiedLM()
        xser.save(m, path, durable=False)
        assert len(data_files(path)) == 1
        back = xser.load(path)
        assert back.proj.weight is back.emb.weight
        same_state(m, back)

    def test_tied_across_components(self, tmp_path):
        """The decoder's output layer is the encoder's embedding: stored once, one Parameter after loading."""
        path = str(tmp_path / "m.yaml")
        m = model()
        train(m)
        xser.save(m, path, durable=False)
        files = data_files(path)
        enc, dec = xser.params(m.encoder).name, xser.params(m.decoder).name
        assert f"{enc}/emb.weight.npy" in files and f"{dec}/out.weight.npy" not in files
        manifest = xser.checkpoints(path)[0]
        assert manifest.id
        back = xser.load(path)
        assert back.decoder.out.weight is back.encoder.emb.weight
        same_state(m, back)

    def test_untied_are_separate(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        xser.save(model(tie=False), path, durable=False)
        assert len(data_files(path)) == 9


class TestLoad:
    def test_optimizer_state_round_trip_resumes_exactly(self, tmp_path):
        """Save model + Adam state, load both in a fresh object, keep training: bit-identical to never stopping."""
        torch.manual_seed(0)
        a = model()
        opt = train(a, steps=2)
        path = str(tmp_path / "m.yaml")
        with xser.CheckpointSaver(path, durable=False) as saver:
            saver.save(a, step=2, training_state={"optimizer": opt.state_dict(), "rng": torch.get_rng_state()})
        state = xser.load_training_state(path)
        assert isinstance(state["optimizer"]["state"][0]["exp_avg"], torch.Tensor)
        assert state["optimizer"]["state"][0]["step"].dtype == opt.state_dict()["state"][0]["step"].dtype
        assert torch.equal(state["rng"], torch.get_rng_state())
        b = xser.load(path)
        opt_b = torch.optim.Adam(b.parameters(), lr=0.01)
        opt_b.load_state_dict(state["optimizer"])
        train(a, steps=2, seed=1, opt=opt)
        train(b, steps=2, seed=1, opt=opt_b)
        same_state(a, b)

    def test_load_into_keeps_parameter_identity(self, tmp_path):
        """An optimizer made before load_into still owns the model's parameters, which now hold the saved values."""
        path = str(tmp_path / "m.yaml")
        saved = model()
        train(saved)
        xser.save(saved, path, durable=False)
        m = model()
        params_before = list(m.parameters())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        xser.load_into(m, path)
        assert list(m.parameters()) == params_before and all(a is b for a, b in zip(m.parameters(), params_before))
        same_state(saved, m)
        assert opt.param_groups[0]["params"][0] is params_before[0]

    KEYS = [
        (False, ("extra: false", "extra: true"),
         'missing key(s) in state_dict: "more.bias", "more.weight" (needed by the component at {path}.data/spec.yaml:6:12: decoder)'),
        (True, ("extra: true", "extra: false"),
         "params on disk are not declared by the component: more.bias, more.weight (load with strict=False to ignore)"),
    ]

    @pytest.mark.parametrize("extra, edit, message", KEYS, ids=["missing", "unexpected"])
    def test_changed_architecture_lists_keys(self, tmp_path, extra, edit, message):
        """A changed architecture: the keys listed sorted, with the data directory (and the spec line); never half a model."""
        from helpers import edit_spec

        path = str(tmp_path / "m.yaml")
        m = model(extra=extra)
        xser.save(m, path, durable=False)
        edit_spec(path, lambda t: t.replace(*edit))
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{path}.data/{xser.params(m.decoder).name}: " + message.format(path=path)
        if extra:
            assert not hasattr(xser.load(path, strict=False).decoder, "more")

    def test_load_into_lists_keys(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        xser.save(model(extra=True), path, durable=False)
        m = model()
        with pytest.raises(xser.DataError) as info:
            xser.load_into(m, path)
        assert str(info.value).endswith('unexpected key(s): "more.bias", "more.weight" (component at decoder)')
        xser.load_into(m, path, strict=False)

    def test_mmap_tensors_are_backed_by_the_files(self, tmp_path):
        """mmap=True: tensor memory lies in a mapping of the parameter's file (no copy)."""
        path = str(tmp_path / "m.yaml")
        m = model()
        xser.save(m, path, durable=False)
        back = xser.load(path, mmap=True)
        same_state(m, back)
        ptr = back.encoder.emb.weight.data_ptr()
        sub = xser.params(back.encoder).name
        maps = Path("/proc/self/maps").read_text().splitlines()
        hit = [line for line in maps if int(line.split()[0].split("-")[0], 16) <= ptr < int(line.split()[0].split("-")[1], 16)]
        assert hit and hit[0].endswith(f"{sub}/emb.weight.npy")

    def test_eager_tensors_are_private_maps_and_writes_never_reach_the_files(self, tmp_path):
        """An eager load gives tensors over private copy-on-write maps of the files (as safetensors' load_file does):
        an .npy file, a packed container's tensor, a constructor's tensor; writes stay in the process (the files'
        checksums still match); copy=True reads into the process's own memory; load_into copies into its tensors."""
        path = str(tmp_path / "m.yaml")
        m = MappedMix()
        with torch.no_grad():
            for i, t in enumerate(m.state_dict().values()):
                t.copy_(torch.arange(t.numel()).reshape(t.shape) + i)
        xser.save(m, path, durable=False)

        def mapped(t):
            ptr = t.data_ptr()
            hit = [line for line in Path("/proc/self/maps").read_text().splitlines()
                   if int(line.split()[0].split("-")[0], 16) <= ptr < int(line.split()[0].split("-")[1], 16)]
            return bool(hit) and str(tmp_path) in hit[0]

        back = xser.load(path)
        same_state(m, back)
        assert [mapped(t) for t in back.state_dict().values()] == [True] * 3
        with torch.no_grad():
            for t in back.state_dict().values():
                t.add_(1)
        assert torch.equal(back.big, m.big + 1)
        again = xser.load(path, verify=True)  # every checksum still matches: nothing was written to the files
        same_state(m, again)
        assert [mapped(t) for t in again.state_dict().values()] == [True] * 3
        copied = xser.load(path, copy=True)
        same_state(m, copied)
        assert [mapped(t) for t in copied.state_dict().values()] == [False] * 3
        into = MappedMix()
        xser.load_into(into, path)
        same_state(m, into)
        assert [mapped(t) for t in into.state_dict().values()] == [False] * 3
        with pytest.raises(xser.DataError, match="^copy=True reads every array into memory and mmap=True maps them"):
            xser.load(path, mmap=True, copy=True)

    def test_device_cpu_and_cuda(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = model()
        xser.save(m, path, durable=False)
        assert xser.load(path, device="cpu").encoder.emb.weight.device.type == "cpu"
        if torch.cuda.is_available():
            back = xser.load(path, device="cuda")
            assert back.encoder.emb.weight.device.type == "cuda"
            xser.save(back, str(tmp_path / "again.yaml"), durable=False)
            same_state(m, xser.load(str(tmp_path / "again.yaml")))

    def test_tensors_off_the_host_are_copied_one_by_one(self, tmp_path, monkeypatch):
        """Tensors that are not host memory are written through a host copy per tensor (Lazy), blocks included:
        the files are the same as those written straight from memory."""
        import xser.torch.tensors as tensors

        m = model()
        train(m)
        direct, lazy = str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")
        xser.save(m, direct, durable=False, blocks={"*/*.weight": 4})
        copies = []
        real = torch.Tensor.to

        def counting(self, *a, **kw):
            copies.append(tuple(self.shape))
            return real(self, *a, **kw)

        monkeypatch.setattr(tensors, "HOST_DEVICES", ())
        monkeypatch.setattr(torch.Tensor, "to", counting)
        xser.save(m, lazy, durable=False, blocks={"*/*.weight": 4})
        assert {k: v for k, v in data_files(direct).items()} == data_files(lazy)
        for k in data_files(direct):
            assert Path(direct + ".data", k).read_bytes() == Path(lazy + ".data", k).read_bytes()
        assert sorted(copies).count((4, 4)) == 2 and (3, 4) in copies and (11, 4) not in copies


class TestDtypes:
    @pytest.mark.parametrize("mmap", [False, True])
    def test_every_dtype_bit_exact(self, tmp_path, mmap):
        """Every dtype of the table round-trips through torch bit for bit; bf16 and fp8 are their bits on disk."""
        tags = sorted(DTYPES)
        m = AllDtypes(tags)
        g = np.random.default_rng(0)
        for tag in tags:
            t = xser.params(m)[f"t_{tag}"]
            raw = torch.from_numpy(g.integers(0, 256, size=t.numel() * t.element_size(), dtype=np.uint8))
            if tag == "bool":
                raw &= 1
            with torch.no_grad():
                t.view(-1).view(torch.uint8).copy_(raw)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        back = xser.load(path, mmap=mmap)
        for tag in tags:
            a, b = xser.params(m)[f"t_{tag}"], xser.params(back)[f"t_{tag}"]
            assert a.dtype == b.dtype == getattr(torch, tag)
            assert torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)), tag
        sub = xser.params(m).name
        bits = np.load(f"{path}.data/{sub}/t_bfloat16.npy")
        assert bits.dtype == np.uint16 and bits.tobytes() == xser.params(m)["t_bfloat16"].view(torch.int16).numpy().tobytes()

    def test_unsupported_torch_dtype(self, tmp_path):
        m = TiedLM().to(torch.float8_e8m0fnu)
        with pytest.raises(xser.DataError) as info:
            xser.save(m, str(tmp_path / "m.yaml"))
        assert "torch dtype torch.float8_e8m0fnu is not in xser's dtype table" in str(info.value)

    @settings(max_examples=25, deadline=None)
    @given(dims=st.lists(st.integers(0, 5), min_size=0, max_size=3), dtype=st.sampled_from(["float32", "bfloat16", "float16", "int8"]))
    def test_random_shapes(self, tmp_path_factory, dims, dtype):
        m = Shaped(dims, dtype)
        path = str(tmp_path_factory.mktemp("r") / "m.yaml")
        xser.save(m, path, durable=False)
        same_state(m, xser.load(path))


#: the dtypes Module.to(dtype) converts a module's floating-point tensors to: every float and complex dtype of the table
FLOATING = sorted(t for t, d in DTYPES.items() if d.average is not None)


@xser.serializable(tag="!TMappedMix")
class MappedMix(torch.nn.Module):
    """A large tensor (its own .npy file), a small one (packed with others) and a constructor's layer."""

    def __attrs_post_init__(self):
        self.big = xser.params(self).add("big", (256, 1024))
        self.small = xser.params(self).add("small", (3,))
        self.lin = torch.nn.Linear(2, 2, bias=False)


@xser.serializable(tag="!TMixed")
class Mixed(torch.nn.Module):
    """Plain submodules, a 0-d int64 buffer (BatchNorm's num_batches_tracked), a tie and declared tensors."""

    dim: int = 3
    out: int = 2

    def __attrs_post_init__(self):
        self.lin = torch.nn.Linear(self.dim, self.out)
        self.norm = torch.nn.BatchNorm1d(self.out)
        self.head = torch.nn.Linear(self.out, self.out, bias=False)
        self.tied = torch.nn.Linear(self.out, self.out, bias=False)
        self.tied.weight = self.head.weight
        self.gate = xser.params(self).add("gate", (self.out,), init="ones")
        self.count = xser.params(self).add("count", (), dtype=torch.int64, trainable=False)


def randomise(m: torch.nn.Module, seed: int = 0) -> None:
    """Every tensor gets random bits (NaN payloads, -0.0, subnormals included); bools 0 or 1."""
    g = np.random.default_rng(seed)
    with torch.no_grad():
        for t in {id(t): t for t in m.state_dict(keep_vars=True).values()}.values():
            raw = torch.from_numpy(g.integers(0, 256, size=t.numel() * t.element_size(), dtype=np.uint8))
            t.view(-1).view(torch.uint8).copy_(raw & 1 if t.dtype == torch.bool else raw)


def bit_state(m: torch.nn.Module) -> dict[str, tuple]:
    """Each key's dtype, shape, Parameter-ness and bits."""
    return {k: (t.dtype, tuple(t.shape), isinstance(t, torch.nn.Parameter), t.detach().reshape(-1).view(torch.uint8).tolist())
            for k, t in m.state_dict(keep_vars=True).items()}


class TestChangedDtypes:
    """A module whose dtype changed after its constructor ran (.half(), .to(torch.bfloat16), one submodule only) loads as
    it was saved: the constructor builds float32, the saved tensors' dtypes are taken, bit for bit."""

    @pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
    @pytest.mark.parametrize("tag", FLOATING)
    def test_module_to_dtype_round_trips(self, tmp_path, tag, mmap):
        m = Mixed()
        with warnings.catch_warnings():  # complex modules are "a new feature"
            warnings.simplefilter("ignore")
            m = m.to(getattr(torch, tag))
        randomise(m)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        back = xser.load(path, mmap=mmap)
        assert bit_state(back) == bit_state(m)
        assert back.lin.weight.dtype == getattr(torch, tag) and back.count.dtype == torch.int64
        assert back.norm.num_batches_tracked.shape == () and back.tied.weight is back.head.weight
        assert back.gate is xser.params(back)["gate"] and back.gate.requires_grad

    def test_half_bfloat16_and_mixed(self, tmp_path):
        """.half(), .bfloat16() and a module of several dtypes (one submodule converted) load exactly; the model runs."""
        for convert in (lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.double(),
                        lambda m: (m.lin.half(), m.norm.to(torch.bfloat16), m.head.double())):
            m = Mixed()
            randomise(m)
            convert(m)
            path = str(tmp_path / "m.yaml")
            xser.save(m, path, durable=False)
            back = xser.load(path)
            assert bit_state(back) == bit_state(m)
            assert back.norm.num_batches_tracked.shape == () and back.norm.num_batches_tracked.dtype == torch.int64
        x = torch.randn(4, 3, dtype=torch.float64)
        m, back = Mixed().double(), None
        xser.save(m, str(tmp_path / "d.yaml"), durable=False)
        back = xser.load(str(tmp_path / "d.yaml"))
        assert torch.equal(back.norm(back.lin(x)), m.norm(m.lin(x)))

    def test_device_and_resume(self, tmp_path):
        """device= moves the tensors with their saved dtypes; resume gives the half model and its optimizer state back."""
        m = Mixed().half()
        randomise(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        path = str(tmp_path / "m.yaml")
        with xser.CheckpointSaver(path, durable=False) as saver:
            saver.save(m, step=1, training_state={"opt": opt.state_dict()})
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            back = xser.load(path, device=device)
            assert back.lin.weight.device.type == device and back.lin.weight.dtype == torch.float16
            assert bit_state(back.cpu()) == bit_state(m)
        r = xser.resume(path)
        assert bit_state(r.model) == bit_state(m)

    def test_load_into_casts_like_load_state_dict(self, tmp_path, caplog):
        """load_into a module of other floating dtypes copies with a cast, as load_state_dict does: parameter objects
        and the module's dtypes stay; widening is exact and silent, a cast that can round is logged, tensor by tensor."""
        half = Mixed().half()
        randomise(half)
        path = str(tmp_path / "m.yaml")
        xser.save(half, path, durable=False)
        m = Mixed()
        before = list(m.parameters())
        with caplog.at_level("WARNING", logger="xser"):
            xser.load_into(m, path)
        assert caplog.records == []
        assert all(a is b for a, b in zip(m.parameters(), before, strict=True))
        for k, t in m.state_dict().items():
            want = half.state_dict()[k]
            assert t.dtype == (torch.int64 if k.endswith(("count", "num_batches_tracked")) else torch.float32), k
            assert torch.equal(t.reshape(-1).view(torch.uint8), want.to(t.dtype).reshape(-1).view(torch.uint8)), k
        narrow = Mixed().to(torch.bfloat16)
        xser.load_into(narrow, path)
        sub = xser.params(half).name
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}.data/{sub}: load_into rounded 9 tensor(s) to the object's dtypes (as load_state_dict does): "
            "gate, head.weight, lin.bias, lin.weight, norm.bias, norm.running_mean, norm.running_var, norm.weight, tied.weight: "
            "float16 on disk, bfloat16 in the object"
        ]

    def test_other_dtype_changes_are_refused(self, tmp_path):
        """Only floating-point dtypes follow the saved ones (what Module.to changes): an integer tensor saved in another
        dtype than its constructor makes is a code change, refused with every such tensor named."""
        m = Mixed()
        m.count = m.count.to(torch.int32)
        m.norm.num_batches_tracked = m.norm.num_batches_tracked.to(torch.float32)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        data = f"{path}.data/{xser.params(m).name}"
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{data}: " + MISMATCH["int load"].format(path=path)
        target = Mixed()
        before = bit_state(target)
        with pytest.raises(xser.DataError) as info:
            xser.load_into(target, path)
        assert str(info.value) == f"{data}: " + MISMATCH["int load_into"]
        assert bit_state(target) == before  # nothing was read into it


    def test_setting_a_tensor_needs_its_dtype(self):
        """params(m)[name] = value is exact: no cast (that is load_into's), the value's shape and dtype are the tensor's."""
        m = Mixed()
        p = xser.params(m)
        with pytest.raises(xser.DataError) as info:
            p["gate"] = torch.ones(2, dtype=torch.float64)
        assert str(info.value) == f"{p.name}: param 'gate': (2,) float64 given, the module holds (2,) float32"
        p["gate"] = torch.full((2,), 3.0)
        assert m.gate.tolist() == [3.0, 3.0] and m.gate is p["gate"]

    @pytest.mark.parametrize("fmt", ["npy", "safetensors"])
    def test_zero_dim_tensors_through_export_and_import(self, tmp_path, fmt):
        """BatchNorm's num_batches_tracked (and any 0-d tensor) keeps shape () through save, load, `xser export
        safetensors`, `xser import safetensors` and the export of the import, as safetensors itself reads it."""
        from safetensors import safe_open

        from xser.cli import main

        m = Mixed().to(torch.bfloat16)
        randomise(m)
        path = str(tmp_path / "m.yaml")
        xser.save(m, path, durable=False)
        assert xser.load(path).norm.num_batches_tracked.shape == ()
        assert main(["export", "safetensors", path, str(tmp_path / "hf")]) == 0
        assert main(["import", "safetensors", str(tmp_path / "hf"), str(tmp_path / "imp.yaml"), "--format", fmt]) == 0
        assert main(["export", "safetensors", str(tmp_path / "imp.yaml"), str(tmp_path / "hf2")]) == 0
        imported = xt.state_dict(str(tmp_path / "imp.yaml"))
        for out in ("hf", "hf2"):
            with safe_open(str(tmp_path / out / "model.safetensors"), "pt") as f:
                assert f.get_tensor("norm.num_batches_tracked").shape == () and f.get_tensor("count").shape == ()
                again = {k: f.get_tensor(k) for k in f.keys()}
            assert set(again) == set(m.state_dict())
            for k, t in m.state_dict().items():
                for got in (again[k], imported[k]):
                    assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got.view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), k
        fresh = Mixed().to(torch.bfloat16)
        xt.load_state_dict(fresh, str(tmp_path / "imp.yaml"))
        assert bit_state(fresh) == bit_state(m)


#: the exact messages of refused loads: shapes and dtypes the module cannot take
KEEPS = ("integer and bool tensors keep the dtype their constructor gives them (only floating-point and complex ones take the "
         "saved dtype, as Module.to converts only those)")
SAME_ARGS = ("its constructor arguments are the saved ones: the difference comes from its class's code, or from a change made "
             "after the constructor ran")
MISMATCH = {
    "int load": "2 tensor(s) of the module differ from the checkpoint: count: () int64 in the module, () int32 on disk; "
                f"norm.num_batches_tracked: () int64 in the module, () float32 on disk; {KEEPS}; {SAME_ARGS} "
                "(needed by the component at {path}.data/spec.yaml:4:13)",
    "int load_into": "count: () int64 in the module, () int32 on disk; norm.num_batches_tracked: () int64 in the module, "
                     f"() float32 on disk; {KEEPS}; {SAME_ARGS} (component at the root)",
    "shape load_into": "gate: (5,) float32 in the module, (2,) float16 on disk; head.weight: (5, 5) float32 in the module, (2, 2) float16 on disk; lin.bias: (5,) float32 in the module, "
                       "(2,) float16 on disk; lin.weight: (5, 4) float32 in the module, (2, 3) float16 on disk; "
                       "norm.bias: (5,) float32 in the module, (2,) float16 on disk; norm.running_mean: (5,) float32 in the "
                       "module, (2,) float16 on disk; norm.running_var: (5,) float32 in the module, (2,) float16 on disk; "
                       "norm.weight: (5,) float32 in the module, (2,) float16 on disk; tied.weight: (5, 5) float32 in the "
                       "module, (2, 2) float16 on disk; constructor argument(s) that differ: dim=4 here, 3 saved, out=5 here, "
                       "2 saved (component at the root)",
    "code changed": "3 tensor(s) of the module differ from the checkpoint: gate: (4,) float32 in the module, (2,) float32 on disk; "
                    "lin.bias: (4,) float32 in the module, (2,) float32 on disk; lin.weight: (4, 3) float32 in the module, "
                    f"(2, 3) float32 on disk; {SAME_ARGS} (needed by the component at {{path}}.data/spec.yaml:4:13)",
    "two components": "parameters differ from the checkpoint in shape or dtype: component at encoder ({enc}): emb.weight: "
                      "(11, 6) float32 in the module, (11, 4) float32 on disk; norm.bias: (6,) float32 in the module, (4,) float32 "
                      "on disk; norm.running_mean: (6,) float32 in the module, (4,) float32 on disk; norm.running_var: (6,) "
                      "float32 in the module, (4,) float32 on disk; norm.weight: (6,) float32 in the module, (4,) float32 on "
                      "disk; constructor argument(s) that differ: dim=6 here, 4 saved | component at decoder ({dec}): gate: "
                      "(6,) float32 in the module, (4,) float32 on disk; out.weight: (11, 6) float32 in the module, (11, 4) float32 on disk; "
                      "its constructor arguments are the saved ones: the "
                      "difference comes from its class's code, or from a change made after the constructor ran",
    "state dict": "loading into Module: 2 tensor(s) differ in shape: 'emb.weight' is [7, 3] on disk, [7, 4] in the module; "
                  "'proj.weight' is [7, 3] on disk, [7, 4] in the module",
}

SCALE = {"k": 1}


@xser.serializable(tag="!TScaled")
class Scaled(torch.nn.Module):
    dim: int = 3
    out: int = 2

    def __attrs_post_init__(self):
        self.lin = torch.nn.Linear(self.dim, self.out * SCALE["k"])
        self.gate = xser.params(self).add("gate", (self.out * SCALE["k"],), init="ones")
        self.fixed = torch.nn.Linear(1, 1)


class TestMismatchMessages:
    """A shape or dtype the module cannot take: every such tensor is listed, with the constructor arguments that differ
    from the saved ones (or the note that none does); nothing is read before the check."""

    def test_load_into_another_size(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = Mixed().half()
        xser.save(m, path, durable=False)
        with pytest.raises(xser.DataError) as info:
            xser.load_into(Mixed(dim=4, out=5), path)
        assert str(info.value) == f"{path}.data/{xser.params(m).name}: " + MISMATCH["shape load_into"]

    def test_code_changed_since_the_save(self, tmp_path, monkeypatch):
        path = str(tmp_path / "m.yaml")
        m = Scaled()
        xser.save(m, path, durable=False)
        monkeypatch.setitem(SCALE, "k", 2)
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        assert str(info.value) == f"{path}.data/{xser.params(m).name}: " + MISMATCH["code changed"].format(path=path)

    def test_every_component_is_listed(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = model(dim=4)
        xser.save(m, path, durable=False)
        with pytest.raises(xser.DataError) as info:
            xser.load_into(model(dim=6), path)
        names = {"enc": xser.params(m.encoder).name, "dec": xser.params(m.decoder).name}
        assert str(info.value) == f"{path}.data: " + MISMATCH["two components"].format(**names)

    def test_flat_state_dict_casts_like_load_state_dict(self, tmp_path, caplog):
        """xser.torch.load_state_dict into a module of other dtypes: cast as torch does; casts that can round are logged."""
        path = str(tmp_path / "m.yaml")
        m = TiedLM()
        xser.save(m, path, durable=False)
        plain = torch.nn.Module()
        plain.emb = torch.nn.Embedding(7, 3).double()
        plain.proj = torch.nn.Linear(3, 7, bias=False).half()
        with caplog.at_level("WARNING", logger="xser"):
            xt.load_state_dict(plain, path)
        assert torch.equal(plain.emb.weight, m.emb.weight.double()) and torch.equal(plain.proj.weight, m.emb.weight.half())
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: load_state_dict rounded 1 tensor(s) to the module's dtypes (as load_state_dict does): proj.weight: "
            "float32 on disk, float16 in the module"
        ]

    def test_flat_state_dict_lists_every_shape(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        xser.save(TiedLM(), path, durable=False)
        plain = torch.nn.Module()
        plain.emb = torch.nn.Embedding(7, 4)
        plain.proj = torch.nn.Linear(4, 7, bias=False)
        with pytest.raises(xser.DataError) as info:
            xt.load_state_dict(plain, path)
        assert str(info.value) == f"{path}: " + MISMATCH["state dict"]


class TestViews:
    def test_flat_state_dict_without_classes(self, tmp_path):
        """xser.torch.state_dict: keys are component path + key; tied tensors are one tensor."""
        path = str(tmp_path / "m.yaml")
        m = model()
        train(m)
        xser.save(m, path, durable=False)
        view = xt.state_dict(path)
        assert sorted(view) == sorted(
            ["encoder.emb.weight", "encoder.norm.weight", "encoder.norm.bias", "encoder.norm.running_mean",
             "encoder.norm.running_var", "encoder.norm.num_batches_tracked", "decoder.out.weight", "decoder.gate", "decoder.count"]
        )
        assert view["decoder.out.weight"] is view["encoder.emb.weight"]
        own = m.state_dict()
        for k, v in view.items():
            assert torch.equal(v, own[k]), k

    def test_load_state_dict_into_a_plain_module(self, tmp_path):
        path = str(tmp_path / "m.yaml")
        m = TiedLM()
        xser.save(m, path, durable=False)
        plain = torch.nn.Module()
        plain.emb = torch.nn.Embedding(7, 3)
        plain.proj = torch.nn.Linear(3, 7, bias=False)
        xt.load_state_dict(plain, path)
        assert torch.equal(plain.emb.weight, m.emb.weight) and torch.equal(plain.proj.weight, m.emb.weight)
        plain.other = torch.nn.Linear(1, 1)
        with pytest.raises(xser.DataError) as info:
            xt.load_state_dict(plain, path)
        assert str(info.value) == f'{path}: loading into Module: missing key(s) in state_dict: "other.bias", "other.weight"'


class Undecorated(torch.nn.Module):
    """A module of the user's own that is not @xser.serializable."""

    def __init__(self, width: int, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.proj = torch.nn.Linear(width, width)


def tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                                  max_position_embeddings=16)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def in_fresh_process(code: str, tmp_path) -> str:
    """Run ``code`` in a new interpreter (only what it imports is imported) and return its stdout."""
    import os
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(Path(xser.__file__).resolve().parent.parent))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=False, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


WRAP_ERRORS = {
    "save plain": "cannot save a value of type torch.nn.modules.linear.Linear: a torch.nn.Module is saved when its class is "
                  "@xser.serializable; for a module of another class (a torch.nn layer, a transformers model) use "
                  "xser.torch.wrap(module), or xser.torch.wrap(module, *args, **kwargs) with the arguments it was made with",
    "nested plain": "lm: cannot save a value of type torch.nn.modules.linear.Linear: a torch.nn.Module is saved when its class "
                    "is @xser.serializable; for a module of another class (a torch.nn layer, a transformers model) use "
                    "xser.torch.wrap(module), or xser.torch.wrap(module, *args, **kwargs) with the arguments it was made with",
    "wrong args": "wrap: torch.nn.Linear(4, 3) does not build this module's tensors: bias: (2,) in the module, (3,) built; "
                  "weight: (2, 4) in the module, (3, 4) built; pass the arguments it was made with: "
                  "xser.torch.wrap(module, *args, **kwargs)",
    "other config": "wrap: torch.nn.Dropout(p=0.1) builds another module: 'Dropout(p=0.1, inplace=False)' where this one has "
                    "'Dropout(p=0.3, inplace=False)'; pass the arguments it was made with: xser.torch.wrap(module, *args, **kwargs)",
    "unreadable": "wrap: test_torch.Undecorated() cannot be built again: TypeError: Undecorated.__init__() missing 1 required "
                  "positional argument: 'width'; pass the arguments it was made with: xser.torch.wrap(module, *args, **kwargs)",
    "decorated": "test_torch.TiedLM is an @xser.serializable class: save it as it is, without wrap",
    "not allowed": "class 'test_torch.Undecorated' may not be built from a spec: only torch.nn layers, transformers models and "
                   "classes passed to xser.torch.allow are; call xser.torch.allow(Undecorated) before loading (after importing it)",
    "os.system": "class 'os.system' may not be built from a spec: only torch.nn layers, transformers models and classes passed "
                 "to xser.torch.allow are; call xser.torch.allow(system) before loading (after importing it)",
    "functional": "'torch.nn.functional' is not a torch.nn.Module class (of transformers, only PreTrainedModel subclasses are built)",
    "auto": "'transformers.AutoModel' is not a torch.nn.Module class (of transformers, only PreTrainedModel subclasses are built)",
}


class TestWrap:
    """Modules whose class is not @xser.serializable (torch.nn layers, transformers models, the user's own): xser.torch.wrap
    records how to build them again; save and load round-trip bit for bit; specs build only allowed classes."""

    @pytest.mark.parametrize("make", [
        lambda: torch.nn.Linear(4, 2), lambda: torch.nn.Linear(4, 2, bias=False).half(), lambda: torch.nn.Conv2d(3, 4, (3, 2), stride=2),
        lambda: torch.nn.LayerNorm(5, eps=1e-3), lambda: torch.nn.Embedding(7, 3, padding_idx=0), lambda: torch.nn.BatchNorm1d(4),
        lambda: torch.nn.MultiheadAttention(8, 2), lambda: torch.nn.Dropout(0.3),
        lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
        lambda: torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 3).to(torch.bfloat16)]),
        lambda: torch.nn.ModuleDict({"a": torch.nn.Linear(2, 3)}),
    ], ids=["linear", "linear-half", "conv", "layernorm", "embedding", "batchnorm", "mha", "dropout", "sequential", "modulelist",
            "moduledict"])
    @pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
    def test_torch_layers_without_arguments(self, tmp_path, make, mmap):
        """wrap(module) reads a torch.nn layer's arguments back (checked on the meta device); containers are rebuilt
        around their wrapped children. The module keeps its state_dict keys; load gives it back bit for bit."""
        m = make()
        randomise(m)
        w = xt.wrap(m)
        path = str(tmp_path / "m.yaml")
        xser.save(w, path, durable=False)
        back = xser.load(path, mmap=mmap)
        assert type(back) is xt.TorchModule and type(back.module) is type(m) and repr(back.module) == repr(w.module)
        assert bit_state(back) == bit_state(w)
        assert {id(t) for t in w.state_dict(keep_vars=True).values()} == {id(t) for t in m.state_dict(keep_vars=True).values()}
        if not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)):
            assert w.module is m and repr(back.module) == repr(m) and list(xt.state_dict(path)) == list(m.state_dict())
            assert bit_state(back.module) == bit_state(m)

    def test_sequential_of_wrapped_layers_runs_the_same(self, tmp_path):
        torch.manual_seed(0)
        s = xt.wrap(torch.nn.Sequential, xt.wrap(torch.nn.Linear, 4, 8), xt.wrap(torch.nn.ReLU), xt.wrap(torch.nn.Linear, 8, 2))
        path = str(tmp_path / "m.yaml")
        xser.save(s, path, durable=False)
        x = torch.randn(3, 4)
        assert torch.equal(xser.load(path)(x), s(x))
        assert "cls: torch.nn.Sequential" in Path(path).read_text()

    def test_transformers_model_round_trips_in_a_fresh_process(self, tmp_path):
        """A tiny BertForMaskedLM: wrap(model) records its config; a new interpreter that imports only xser loads it
        (torch, xser.torch and transformers come with the spec's tags); keys are the model's own, so load_state_dict
        of a fresh BertForMaskedLM takes the flat view strictly; the logits are the same."""
        m = tiny_bert()
        with torch.no_grad():
            m.bert.embeddings.LayerNorm.weight.normal_()  # not the constructor's values
        w = xt.wrap(m)
        path = str(tmp_path / "bert.yaml")
        xser.save(w, path, durable=False)
        assert "cls: transformers.BertForMaskedLM" in Path(path).read_text()
        view = xt.state_dict(path)
        assert list(view) == [k for k in m.state_dict() if k in view] and set(view) == set(m.state_dict())
        fresh = type(m)(m.config)
        fresh.load_state_dict(view, strict=True)
        ids = torch.tensor([[1, 5, 7, 2]])
        m.eval()
        want = m(ids).logits
        torch.save(ids, tmp_path / "ids.pt")
        torch.save(want, tmp_path / "want.pt")
        torch.save(m.state_dict(), tmp_path / "state.pt")
        out = in_fresh_process(
            "import sys, torch, xser\n"
            f"back = xser.load({path!r})\n"
            "assert 'transformers' in sys.modules and type(back.module).__name__ == 'BertForMaskedLM'\n"
            "back.eval()\n"
            f"got = back.module(torch.load({str(tmp_path / 'ids.pt')!r})).logits\n"
            f"print(torch.allclose(got, torch.load({str(tmp_path / 'want.pt')!r}), rtol=0, atol=1e-6))\n"
            f"print(all(torch.equal(a, b) for a, b in zip(back.module.state_dict().values(), torch.load({str(tmp_path / 'state.pt')!r}).values())))\n",
            tmp_path)
        assert out.split() == ["True", "True"]  # the same bits (the logits' float sums may run on other threads)
        back = xser.load(path)
        assert bit_state(back.module) == bit_state(m)
        assert back.module.cls.predictions.decoder.weight is back.module.bert.embeddings.word_embeddings.weight

    def test_wrapped_transformers_model_exports_for_from_pretrained(self, tmp_path):
        """The export of a wrapped model has the model's own keys: from_pretrained (with the model's config.json) finds
        every weight, none missing, unexpected or mismatched, bit for bit."""
        from xser.interop.safetensors import export_safetensors

        m = tiny_bert()
        path = str(tmp_path / "bert.yaml")
        xser.save(xt.wrap(m), path, durable=False)
        export_safetensors(path, tmp_path / "hf")
        m.config.save_pretrained(tmp_path / "hf")
        back, info = type(m).from_pretrained(tmp_path / "hf", output_loading_info=True)
        assert {k: v for k, v in info.items() if v} == {}
        assert bit_state(back) == bit_state(m)

    def test_half_transformers_model(self, tmp_path):
        m = tiny_bert().half()
        path = str(tmp_path / "bert.yaml")
        xser.save(xt.wrap(m), path, durable=False)
        assert bit_state(xser.load(path).module) == bit_state(m)

    def test_own_class_needs_allow_in_a_new_process(self, tmp_path):
        """A class of the user's own: wrap(module, *args) allows it in this process; a new process must allow it."""
        m = Undecorated(3, scale=2.0)
        w = xt.wrap(m, 3, scale=2.0)
        path = str(tmp_path / "m.yaml")
        xser.save(w, path, durable=False)
        assert bit_state(xser.load(path).module) == bit_state(m)
        tests = str(Path(__file__).resolve().parent)
        out = in_fresh_process(
            f"import sys; sys.path.insert(0, {tests!r})\nimport xser\nimport xser.torch as xt\nfrom test_torch import Undecorated\n"
            f"try:\n    xser.load({path!r})\nexcept xser.SpecError as e:\n    print(e.message)\n"
            f"xt.allow(Undecorated)\nprint(xser.load({path!r}).module.scale)\n", tmp_path)
        assert out.splitlines() == [WRAP_ERRORS["not allowed"], "2.0"]

    @pytest.mark.parametrize("key, make", [
        ("wrong args", lambda: xt.wrap(torch.nn.Linear(4, 2), 4, 3)),
        ("other config", lambda: xt.wrap(torch.nn.Dropout(0.3), p=0.1)),
        ("unreadable", lambda: xt.wrap(Undecorated(3))),
        ("decorated", lambda: xt.wrap(TiedLM())),
    ])
    def test_wrap_refuses_what_would_not_load(self, key, make):
        with pytest.raises(xser.RegistryError) as info:
            make()
        assert str(info.value) == WRAP_ERRORS[key]

    def test_saving_a_plain_module_names_wrap(self, tmp_path):
        with pytest.raises(xser.SpecError) as info:
            xser.save(torch.nn.Linear(4, 2), str(tmp_path / "m.yaml"))
        assert str(info.value) == WRAP_ERRORS["save plain"]
        with pytest.raises(xser.SpecError) as info:
            xser.save({"lm": torch.nn.Linear(4, 2)}, str(tmp_path / "m.yaml"))
        assert str(info.value) == WRAP_ERRORS["nested plain"]
        assert not (tmp_path / "m.yaml").exists()

    @pytest.mark.parametrize("key, cls", [("os.system", "os.system"), ("functional", "torch.nn.functional"),
                                          ("auto", "transformers.AutoModel"), ("not allowed", "test_torch.Undecorated")])
    def test_specs_build_only_allowed_classes(self, tmp_path, key, cls, monkeypatch):
        """A spec that names any other callable is refused before anything is called or imported."""
        import sys

        pytest.importorskip("transformers")
        from xser.torch import wrapped as wrapping

        monkeypatch.setattr(wrapping, "_ALLOWED", {})
        called = []
        monkeypatch.setattr("os.system", lambda *a: called.append(a))
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"m: !TorchModule {{cls: {cls}, args: [echo hi]}}\n")
        with pytest.raises(xser.SpecError) as info:
            xser.build(xser.load_config(cfg)["m"])
        assert str(info.value) == f"{cfg}:1:4: {WRAP_ERRORS[key]}"
        assert called == [] and "antigravity" not in sys.modules
