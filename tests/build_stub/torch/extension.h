// A stand-in for torch/extension.h: tests/test_build_command.py builds real extensions without parsing torch's
// headers. In the repository, where the build sandbox reads it (its private /tmp hides a test's tmp_path).
#pragma once
