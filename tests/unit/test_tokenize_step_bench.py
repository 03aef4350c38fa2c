"""benchmarks/tokenize_step.py's repository: the zoo MiniLM's tokenize step twice, one copy on Python's path."""

from benchmarks.tokenize_step import write_repo
from tpserve.builders.repository.model_config import parse_pbtxt


def test_two_copies_of_the_tokenize_step_one_of_them_on_pythons_path(tmp_path):
    names = write_repo(tmp_path, 0)
    for path, flag in (("native", "1"), ("python", "0")):
        config = parse_pbtxt((tmp_path / names[path] / "config.pbtxt").read_text())
        assert config.name == names[path] and config.backend == "torch_inprocess"
        assert config.parameters["runtime"].string_value == "tokenize"
        assert config.parameters["native_path"].string_value == flag
        assert config.parameters["tokenize_processes"].string_value == "0"
        assert (tmp_path / names[path] / "1" / "tokenizer.json").is_file()
