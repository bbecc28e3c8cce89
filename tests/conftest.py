import os

import hypothesis

hypothesis.settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True)
hypothesis.settings.register_profile("dev", max_examples=30, deadline=None)
hypothesis.settings.load_profile("ci" if os.environ.get("CI") else "dev")
