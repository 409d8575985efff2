"""Parameter checking without torch or pandas: typed values (:mod:`.values`), the pydantic
schema blocks of the parameter groups (:mod:`.schema`) and the task-source table
(:mod:`.task_sources`). Everything here runs before a run's first node, in seconds."""
