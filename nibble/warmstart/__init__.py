"""The supervised warm start RL begins from: teacher-forced training on a task's reference answers (``sft``)."""
