"""The entry point's path before the layout change (``inner.entrypoint=inner_loop.member_entry:train_member``), as
run directories and queued jobs of earlier searches name it: this name is inner_loop/member/entry.py itself (the same
module object; its train_member names the member program), so they resume and run unchanged. Nothing new imports
this module."""
import sys

import inner_loop.member.entry as _entry

sys.modules[__name__] = _entry
