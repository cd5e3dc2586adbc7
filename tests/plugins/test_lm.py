"""The ``lm`` task: reading text, held-out tails, windows that never span documents, tokenizers'
byte counts, the metrics against an independent computation, and bad text refused in one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from ablate import registry
from ablate.cache import cache_dir
from ablate.components import BuildContext
from ablate.errors import DataError
from ablate.study.load import load_study
from ablate.training.trainer import train_trial
from ablate_plugins.attention import SoftmaxAttention, SoftmaxOptions
from ablate_plugins.lm import (
    LMModel,
    LMOptions,
    LMTask,
    char_byte_ends,
    collate,
    cut_tail,
    load_corpus,
    make_tokenizer,
    windows_of,
)
from ablate_plugins.lm.corpus import even_share
from ablate_plugins.lm.options import BPETokenizer, BytesTokenizer, FileData, FileTokenizer

TEXT = "Héllo wörld, the cat sat on the mat. 日本語のテキスト.\n" * 6


def task(tmp_path, **options) -> LMTask:
    return LMTask(LMOptions.model_validate(options), tmp_path)


def test_two_line_task_section_reads_a_folder_of_txt_files(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.txt").write_text(TEXT * (i + 1))
    (folder / "skip.md").write_text("not read")
    options = LMOptions.model_validate({"data": {"path": "texts/"}})
    assert isinstance(options.data, FileData) and options.tokenizer.kind == "bytes"
    data = LMTask(options, tmp_path).load()
    total = sum(len((TEXT * (i + 1)).encode()) for i in range(3))
    assert sum(data.bytes.values()) == total  # nothing lost or read twice at the cuts (budget not hit)
    assert data.vocab_size == 257 and registry.get("task", "lm") is LMTask


def test_tail_fractions_cut_by_bytes_and_keep_characters_whole():
    docs = ["aé" * 50, "日本" * 30, "z" * 100]
    head, tail = cut_tail(docs, 0.3)
    total = sum(len(d.encode()) for d in docs)
    assert "".join(head) + "".join(tail) == "".join(docs)
    assert abs(sum(len(t.encode()) for t in tail) - 0.3 * total) <= 3  # within one character
    head, tail = cut_tail(["日本語"], 0.5)  # one document, cut inside a 3-byte character
    assert (head, tail) == (["日"], ["本語"])


def test_jsonl_and_parquet_documents_and_separate_held_out_files(tmp_path):
    rows = [{"text": f"document {i} " * 20, "id": i} for i in range(6)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    pq.write_table(pa.table({"body": [r["text"] for r in rows]}), tmp_path / "b.parquet")
    (tmp_path / "v.txt").write_text("held out validation text\n" * 4)
    (tmp_path / "t.txt").write_text("held out test text\n" * 4)
    jsonl = load_corpus(FileData(path="a.jsonl"), tmp_path, 0.1, 0.1)
    assert len(jsonl.splits["train"]) + len(jsonl.splits["valid"]) + len(jsonl.splits["test"]) >= 6
    own = FileData(path="b.parquet", text_field="body", valid_path="v.txt", test_path="t.txt")
    corpus = load_corpus(own, tmp_path, 0.1, 0.1)
    # nothing cut off: the held-out text is given (the documents in their drawn order)
    assert sorted(corpus.splits["train"]) == sorted(r["text"] for r in rows)
    assert corpus.splits["test"] == ["held out test text\n" * 4]


def test_held_out_documents_are_drawn_across_the_corpus_by_a_hash_of_their_names(tmp_path):
    """Not the tail of the name order: the held-out files are the tail of the order of their names'
    hashes, the same on every read; the evaluation budget comes from every held-out document."""
    import hashlib

    folder = tmp_path / "texts"
    folder.mkdir()
    texts = {f"{i:02d}.txt": f"document {i:02d}: " + "words of text " * 40 + "\n" for i in range(20)}
    for name, text in texts.items():
        (folder / name).write_text(text)
    corpus = load_corpus(FileData(path="texts"), tmp_path, 0.1, 0.1)
    by_hash = sorted(texts, key=lambda n: hashlib.blake2b(n.encode(), digest_size=8).digest())
    size = len(texts["00.txt"].encode())  # every document has the same size: two whole ones a split
    assert corpus.splits["test"] == [texts[n] for n in by_hash[-2:]]
    assert corpus.splits["valid"] == [texts[n] for n in by_hash[-4:-2]]
    assert sorted(corpus.splits["train"]) == sorted(texts[n] for n in by_hash[:-4])
    assert by_hash[-4:] != sorted(texts)[-4:] and 20 * size * 0.1 == 2 * size
    assert load_corpus(FileData(path="texts"), tmp_path, 0.1, 0.1).splits == corpus.splits
    # The budget: each of the 2 test documents gives a quarter of its bytes, one passage of it.
    data = task(
        tmp_path,
        data={"path": "texts"},
        window=16,
        valid_fraction=0.1,
        test_fraction=0.1,
        eval_bytes=size // 2,
    ).load()
    assert data.splits["test"].documents == 2 and data.bytes["test"] == 2 * (size // 4)
    test_text = bytes(data.splits["test"].ids[data.splits["test"].nbytes > 0].tolist()).decode()
    for name in by_hash[-2:]:  # a passage of each test document
        assert any(texts[name][k : k + 20] in test_text for k in range(0, size - 20))


def test_a_folders_empty_files_are_skipped_with_a_count(tmp_path, capsys):
    """A package's empty ``__init__.py`` files are empty documents, which the corpus drops anyway:
    skipped with one warning line counting them, where a single empty file stays refused."""
    folder = tmp_path / "pkg"
    (folder / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py"):
        (folder / name).write_text("" if name == "__init__.py" else "\n  \n")
    texts = {f"m{i}.py": f"def f{i}():\n    return {i}\n" * 20 for i in range(10)}
    for name, text in texts.items():
        (folder / name).write_text(text)
    corpus = load_corpus(FileData(path="pkg", pattern="**/*.py"), tmp_path, 0.1, 0.1)
    assert sorted(sum(corpus.splits.values(), [])) == sorted(texts.values())
    assert capsys.readouterr().err.strip() == f"warning: {folder}: 2 empty file(s) skipped"
    with pytest.raises(DataError, match=r"__init__\.py: the file is empty$"):
        load_corpus(FileData(path="pkg/__init__.py"), tmp_path, 0.1, 0.1)


def test_even_share_takes_the_same_fraction_of_every_document():
    docs = ["a" * 1000, "b" * 300, "c" * 100, "日本語" * 40]  # 1,760 bytes
    share = even_share(docs, 440)
    assert [s[0] for s in share[:3]] == ["a", "b", "c"]
    assert [len(s) for s in share[:3]] == [250, 75, 25]  # a quarter of each
    assert 87 <= len(share[3].encode()) <= 90 and len(share[3].encode()) % 3 == 0  # whole characters
    assert share[3] in "日本語" * 40 and even_share(docs[:2], 5000) == docs[:2]
    assert even_share(docs, 440) == share  # the same passages every time


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("bin.txt", b"abc\x00\x01\x02", "a binary file, not text (a NUL byte at byte 3)"),
        ("empty.txt", b"  \n", "the file is empty"),
        ("latin.txt", "caf\xe9 au lait\n".encode("latin-1"), ":1: byte 0xe9 at column 4 is not UTF-8"),
        ("bad.jsonl", b'{"text": "ok"}\n{"txt": "no"}\n', ":2: the record has no 'text' field"),
        ("broken.jsonl", b'{"text": "ok"}\n{"text": \n', ":2: not a JSON object"),
        ("short.txt", b"tiny text\n", "shorter than one window (task.window = 64 predictions)"),
        ("fake.parquet", b"this is not parquet\n", "not a readable parquet file"),
    ],
)
def test_bad_text_is_one_line_and_exit_status_2(tmp_path, write_study, cli, name, content, words):
    (tmp_path / name).write_bytes(content)
    study = write_study(
        replace={
            "task": {"kind": "lm", "data": {"path": name}, "window": 64},
            "model.bias": [{"kind": "rope"}],
            "metrics": {"primary": "loss", "also": ["bpb"]},
            "train.loss": {},
        }
    )
    code, _, err = cli("validate", study)
    errors = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(errors) == 1, err
    assert name in errors[0] and words in errors[0], errors[0]


def test_windows_never_span_documents_and_predict_every_token_once():
    docs = ["abcdefghij", "xy", "", "0123456789abcdef"]
    tokens = windows_of(make_tokenizer(BytesTokenizer(), [], None).encode(docs), window=4)
    assert tokens.documents == 3  # the empty document predicts nothing
    # Document starts (id 256) open rows only: a row's inputs after position 0 never hold one.
    batch = collate(tokens, np.arange(tokens.windows))
    assert not (batch.inputs[:, 1:] == 256).any() and not (batch.targets == 256).any()
    assert batch.valid.sum().item() == sum(len(d.encode()) for d in docs)  # each byte a target once
    targets = [bytes(batch.targets[r, batch.valid[r]].tolist()) for r in range(tokens.windows)]
    assert b"".join(targets) == "".join(docs).encode()
    assert tokens.lengths.tolist() == [4, 4, 2, 2, 4, 4, 4, 4]
    assert tokens.window_bytes().tolist() == tokens.lengths.tolist()


def test_bpe_byte_counts_sum_to_the_text_and_the_trained_tokenizer_is_cached(tmp_path):
    docs = [TEXT, "def f(x):\n    return x  # ünïcödé\n" * 20]
    options = BPETokenizer(kind="bpe", vocab_size=300, min_frequency=2)
    bpe = make_tokenizer(options, docs, tmp_path)
    assert list(cache_dir().glob("lm/bpe-*.json")), "the trained BPE is kept in the cache"
    for doc, enc in zip(docs, bpe.encode(docs), strict=True):
        assert enc.ids[0] == bpe.bos and enc.nbytes[0] == 0
        assert int(enc.nbytes.sum()) == len(doc.encode()) and (enc.nbytes >= 0).all()
        assert bpe.tokenizer.decode(enc.ids[1:].tolist()) == doc
        assert len(enc.ids) < len(doc.encode())  # merges learned
    again = make_tokenizer(options, docs, tmp_path)
    assert again.tokenizer.to_str() == bpe.tokenizer.to_str()
    # a user's tokenizer.json, with its document start named
    path = tmp_path / "tokenizer.json"
    bpe.tokenizer.save(str(path))
    mine = make_tokenizer(FileTokenizer(kind="file", path="tokenizer.json"), [], tmp_path)
    assert mine.bos == bpe.bos and mine.encode(docs)[1].ids.tolist() == bpe.encode(docs)[1].ids.tolist()
    with pytest.raises(DataError, match="no document-start token"):
        make_tokenizer(FileTokenizer(kind="file", path="tokenizer.json", bos="<nope>"), [], tmp_path)


def test_a_tokenizer_pattern_that_backtracks_without_end_is_one_line_not_a_panic(tmp_path, capfd):
    """The regex engine gives up on ``((a*)*)*$`` over a long run of a's, and the library panics in
    each of its threads (their reports, backtraces and all, hundreds of lines on fd 2)."""
    bpe = make_tokenizer(BPETokenizer(kind="bpe", vocab_size=270, min_frequency=2), [TEXT], tmp_path)
    spec = json.loads(bpe.tokenizer.to_str())
    split = {"type": "Split", "pattern": {"Regex": "((a*)*)*$"}, "behavior": "Isolated", "invert": False}
    spec["pre_tokenizer"] = split
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    hostile = make_tokenizer(FileTokenizer(kind="file", path="tokenizer.json", bos="<|doc|>"), [], tmp_path)
    assert len(hostile.encode(["fine text"])[0].ids) > 1  # a text it can match is encoded
    capfd.readouterr()
    with pytest.raises(DataError) as refused:
        hostile.encode(["a" * 3000 + "c"] * 4)
    said = str(refused.value)
    assert (
        said.startswith(f"{tmp_path / 'tokenizer.json'}: the tokenizer failed on the text (")
        and "\n" not in said
    )
    assert "panicked" not in capfd.readouterr().err


def test_an_edited_kept_tokenizer_or_a_cache_others_can_write_is_trained_again(tmp_path, monkeypatch, capsys):
    """A kept BPE is used only while its content has the SHA-256 written beside it: one planted
    in its place (a valid tokenizer, other merges) is never trained on."""
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    docs = [TEXT, "def f(x):\n    return x\n" * 20]
    options = BPETokenizer(kind="bpe", vocab_size=280, min_frequency=2)
    trained = make_tokenizer(options, docs, tmp_path).tokenizer.to_str()
    (entry,) = (tmp_path / "cache" / "lm").glob("bpe-*.json")
    assert entry.with_suffix(".sha256").is_file() and "warning" not in capsys.readouterr().err
    make_tokenizer(options, ["zzzz yyyy " * 50], tmp_path).tokenizer.save(str(entry))  # planted
    again = make_tokenizer(options, docs, tmp_path)
    err = capsys.readouterr().err
    assert again.tokenizer.to_str() == trained, "the planted tokenizer was used"
    assert f"warning: {entry}: a kept tokenizer not used, its content is not what was written" in err
    assert make_tokenizer(options, docs, tmp_path).tokenizer.to_str() == trained  # kept again, checked
    assert "warning" not in capsys.readouterr().err
    (tmp_path / "cache" / "lm").chmod(0o777)  # any local user could replace an entry here
    assert make_tokenizer(options, docs, tmp_path).tokenizer.to_str() == trained
    assert "not using the tokenizer cache" in capsys.readouterr().err


def test_char_byte_ends():
    assert char_byte_ends("aé日😀").tolist() == [0, 1, 3, 6, 10]


def tiny_model(vocab: int, dim: int = 16) -> LMModel:
    """A one-attention 'backbone' stand-in: embedding → causal softmax attention → logits."""

    class Backbone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = SoftmaxAttention(SoftmaxOptions(heads=2), BuildContext(dim=dim))

        def forward(self, x, tokens):
            return self.attention(x, tokens)

    return LMModel(Backbone(), vocab, dim).double().eval()


def test_metrics_match_each_window_scored_alone(tmp_path):
    lm = task(tmp_path, data={"format": "synthetic", "documents": 12, "words": 30}, window=24, eval_bytes=400)
    data = lm.load()
    model = tiny_model(data.vocab_size)
    split = data.splits["valid"]
    result = lm.evaluate(model, data, "valid", ["loss", "perplexity", "bpb"], torch.device("cpu"), 5)
    nll, count, nbytes = [], [], []
    for w in range(split.windows):  # independently: each window alone, no padding, no batch
        s, n = int(split.starts[w]), int(split.lengths[w])
        ids = torch.from_numpy(split.ids[s : s + n + 1])
        x = model.embed(ids[None, :-1])
        tokens = collate(split, np.array([w])).token_context()
        logits = model.logits(model.backbone(x, tokens))[0]
        nll.append(F.cross_entropy(logits, ids[1:], reduction="sum").item())
        count.append(n)
        nbytes.append(int(split.nbytes[s + 1 : s + n + 1].sum()))
    assert sum(nbytes) == data.bytes["valid"] <= 400
    loss = sum(nll) / sum(count)
    assert result.summary["loss"] == pytest.approx(loss, rel=1e-9)
    assert result.summary["perplexity"] == pytest.approx(math.exp(loss), rel=1e-9)
    assert result.summary["bpb"] == pytest.approx(sum(nll) / math.log(2) / sum(nbytes), rel=1e-9)
    per_unit = result.per_unit
    assert per_unit["unit"].tolist() == list(range(split.windows))
    np.testing.assert_allclose(per_unit["loss"], np.array(nll) / np.array(count), rtol=1e-9)
    np.testing.assert_allclose(per_unit["bpb"], np.array(nll) / math.log(2) / np.array(nbytes), rtol=1e-9)


def test_training_loss_is_the_mean_over_real_targets_and_ignores_padding(tmp_path):
    lm = task(tmp_path, data={"format": "synthetic", "documents": 6, "words": 20}, window=16, jagged=False)
    data = lm.load()
    model = tiny_model(data.vocab_size)
    train = data.splits["train"]
    rows = np.arange(train.windows)
    short = rows[train.lengths < 16][:2]
    batch = collate(train, np.concatenate([rows[:3], short]))
    loss = lm.loss(model, batch, None, torch.Generator())
    per_row = [lm.loss(model, collate(train, np.array([r])), None, torch.Generator()) for r in batch.windows]
    lengths = torch.tensor(train.lengths[batch.windows.numpy()], dtype=torch.float64)
    assert loss.item() == pytest.approx((torch.stack(per_row) * lengths).sum().item() / lengths.sum().item())


def test_trials_train_with_the_core_trainer_and_report_bits_per_byte(tmp_path, write_study):
    """A tiny byte LM on generated text through ablate's own trial loop (a dense and a MoE
    variant): the metrics come back lower-is-better, loss and perplexity agree, tokens/s counted."""
    study = load_study(
        write_study(
            replace={
                "task": {"kind": "lm", "data": {"format": "synthetic", "documents": 8, "words": 40}},
                "task.window": 16,
                "task.jagged": True,  # position-wise layers on the real tokens only
                "model.bias": [{"kind": "rope"}],
                "model.dropout": 0.0,
                "variants": {"moe": {"ffn": {"kind": "moe", "experts": 2, "top_k": 1, "hidden": 8}}},
                "metrics": {"primary": "bpb", "also": ["loss", "perplexity"]},
                "train": {"epochs": 1, "batch_size": 16, "lr": 0.003},
            }
        )
    )
    data = study.task.load()
    for name in ("base", "moe"):
        result = train_trial(study, study.variants[name], 0, data, torch.device("cpu"))
        bpb = result.summary["test.bpb"]
        assert 0.5 < bpb < 8.0 and result.tokens_per_s > 0  # 8 bits: a uniform guess over bytes
        assert result.summary["test.perplexity"] == pytest.approx(math.exp(result.summary["test.loss"]))
        assert len(result.per_unit) == data.splits["test"].windows
    assert not study.task.metric_higher_is_better("bpb")


def test_every_tokenizer_scores_the_same_held_out_bytes(tmp_path):
    """Bits per byte compare across tokenizers: the held-out budget is cut in bytes before
    tokenising, and each split's window bytes add up to exactly that text."""
    data = {"format": "synthetic", "documents": 30, "words": 60}
    by_bytes = task(tmp_path, data=data, window=32, eval_bytes=900).load()
    by_bpe = task(
        tmp_path, data=data, window=32, eval_bytes=900, tokenizer={"kind": "bpe", "vocab_size": 320}
    ).load()
    assert (
        by_bpe.vocab_size > 257 and by_bpe.splits["train"].predictions < by_bytes.splits["train"].predictions
    )
    for split in ("valid", "test"):
        assert by_bytes.bytes[split] == by_bpe.bytes[split] <= 900
        for data_ in (by_bytes, by_bpe):
            assert int(data_.splits[split].window_bytes().sum()) == data_.bytes[split]


def test_option_errors_name_the_key_as_written(tmp_path, write_study, cli):
    study = write_study(replace={"task": {"kind": "lm", "data": {"path": "t.txt", "colour": 1}}})
    code, _, err = cli("validate", study)
    assert code == 2 and "task.data.colour" in err and "files" not in err.split("task.data.colour")[0][-20:]


def test_the_readme_two_line_task_section_validates_on_a_txt_folder(tmp_path, write_study, cli):
    """README's 'Language models' snippet, as written, on a folder of .txt files."""
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Language models", 1)[1]
    snippet = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    task_section = yaml.safe_load(snippet)["task"]
    assert len(snippet.strip().splitlines()) == 3  # `task:` and two lines under it
    (tmp_path / "my_texts").mkdir()
    for i in range(4):
        (tmp_path / "my_texts" / f"{i}.txt").write_text(TEXT * 8)
    study = write_study(
        replace={
            "task": task_section,
            "model.bias": [{"kind": "rope"}],
            "metrics": {"primary": "bpb"},
            "train.loss": {},
        }
    )
    code, out, err = cli("validate", study)
    assert code == 0, err
    assert "tokenizer bytes" in out and "train documents 4" in out


def test_trivial_baselines_by_hand(tmp_path):
    """Uniform: 8 bits a byte with byte tokens. Unigram: training byte counts + 1 over the 256
    byte values (the document start is never a target), scored on the test text."""
    (tmp_path / "train.txt").write_text("aaab")
    (tmp_path / "v.txt").write_text("ab")
    (tmp_path / "t.txt").write_text("abcé")  # é: two bytes, one token each
    lm = task(tmp_path, data={"path": "train.txt", "valid_path": "v.txt", "test_path": "t.txt"}, window=2)
    data = lm.load()
    found = {b.name: b.values for b in lm.baselines(data, ["loss", "perplexity", "bpb"])}
    assert found["uniform"]["bpb"] == pytest.approx(8.0)
    assert found["uniform"]["loss"] == pytest.approx(math.log(256))
    total = 4 + 256  # a×3, b×1, plus one for each of the 256 byte values
    nll = -(math.log(4 / total) + math.log(2 / total) + math.log(1 / total) + 2 * math.log(1 / total))
    assert found["unigram"]["loss"] == pytest.approx(nll / 5)
    assert found["unigram"]["perplexity"] == pytest.approx(math.exp(nll / 5))
    assert found["unigram"]["bpb"] == pytest.approx(nll / (5 * math.log(2)))
    assert "drawn across the documents" in lm.protocol(["bpb"])
