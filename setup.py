"""The one build step pyproject.toml cannot say: models.toml, hand-edited at the repository's top,
is copied into the built package, beside the module that reads it (specllm.models.registry), as
an installed specllm needs it. An editable install gets no copy: its package is the source tree,
and the registry reads the top-level file beside it."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MODELS_TOML = "models.toml"
PACKAGED_AS = Path("specllm", "models", "models.toml")


class BuildPyWithModels(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            self.mkpath(str(Path(self.build_lib) / PACKAGED_AS.parent))
            self.copy_file(MODELS_TOML, str(Path(self.build_lib) / PACKAGED_AS))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / PACKAGED_AS)]


setup(cmdclass={"build_py": BuildPyWithModels})
