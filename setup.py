"""The build steps pyproject.toml cannot say.

models.toml, hand-edited at the repository's top, is copied into the built package, beside the
module that reads it (specllm.models.registry), as an installed specllm needs it. An editable
install gets no copy: its package is the source tree, and the registry reads the top-level file
beside it.

specllm.engine._sampler, the sampler's work on each row in C, is built where a C compiler is found
and skipped with a warning where none is: specllm.engine.sampling then takes its numpy path, which
gives the same tokens, slower.

A build in a tree that was built before (pip builds in the source tree, in build/) starts from
what the last one left there; setuptools only adds to it, so a module removed from the source since
would still ship: build_py removes what the source no longer has."""

import hashlib
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

MODELS_TOML = "models.toml"
PACKAGED_AS = Path("specllm", "models", "models.toml")


class BuildPyWithModels(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            self.mkpath(str(Path(self.build_lib) / PACKAGED_AS.parent))
            self.copy_file(MODELS_TOML, str(Path(self.build_lib) / PACKAGED_AS))
            self.remove_stale_files()

    def remove_stale_files(self):
        """Files under the built package that this build did not write and build_ext will not
        (its extension, kept so that an unchanged source is not compiled again)."""
        ours = {Path(path) for path in self.get_outputs()}
        ours.update(Path(path) for path in self.get_finalized_command("build_ext").get_outputs())
        for path in (Path(self.build_lib) / "specllm").rglob("*"):
            if path.is_file() and path not in ours:
                path.unlink()

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / PACKAGED_AS)]


SAMPLER_SOURCE = Path("specllm", "engine", "_sampler.c")
SAMPLER = Extension(
    "specllm.engine._sampler",
    sources=[str(SAMPLER_SOURCE)],
    # the module's SOURCE_SHA256, so that a test can tell a build older than its source
    define_macros=[("SOURCE_SHA256", f'"{hashlib.sha256(SAMPLER_SOURCE.read_bytes()).hexdigest()}"')],
    # -O3 vectorises its loops; without traps for floating-point exceptions, also those with selects
    extra_compile_args=[] if sys.platform == "win32" else ["-O3", "-fno-trapping-math"],
    libraries=[] if sys.platform == "win32" else ["m"],  # exp
    optional=True,
)

setup(cmdclass={"build_py": BuildPyWithModels}, ext_modules=[SAMPLER])
