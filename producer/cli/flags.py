"""Errors in the user's words: a spec that ``submit`` built from its options is refused
naming the flag the user typed (``--steps: …``), not the wire's field it set
(``generate.num_inference_steps: …``).

Whatever refuses the spec (its validators, the fleet's rules at submit, the files this host
can see, a worker's refusal seen by ``--wait``) names fields; :func:`as_flags` rewrites every
field it names that an option sets, wherever in the message, and drops the field's own name
where the message repeats it (``num_frames must be 4k+1``). A spec given as a file
(``--spec``, ``--from``) keeps the field names: that file spells them. The HTTP API keeps its
own names too.
"""

from __future__ import annotations

import re

#: The JobSpec field each ``submit`` option sets.
FLAGS: dict[str, str] = {
    "generate.num_inference_steps": "--steps",
    "generate.num_frames": "--frames",
    "generate.width": "--size (width)",
    "generate.height": "--size (height)",
    "generate.prompt": "--prompt",
    "generate.model": "--model",
    "generate.image": "--image",
    "generate.seed": "--seed",
    "generate.tier": "--tier",
    "generate.preview.every": "--preview",
    "generate.preview": "--preview",
    "input.uri": "--input",
    "output.uri": "--output",
    "decoder.name": "--decoder",
    "decoder.weights": "--weights",
    "video.crf": "--crf",
    "video.segment_frames": "--segment-frames",
    "video.fps": "--fps",
    "pipeline.mode": "--mode",
    "priority": "--priority",
    "job_id": "--job-id",
    "tenant": "--tenant",
}
#: A LoRA is the n-th ``--lora`` (any of its fields: the option sets both).
_LORA = r"generate\.loras\[(?P<lora>\d+)\](?:\.(?:uri|scale))?"
# Longest first: generate.preview.every before generate.preview. A field is a whole word:
# not part of another dotted name (video.fps, not fps inside some.video.fps), nor followed by
# a deeper part of it. A name without a dot (job_id, tenant) is a field only where it heads
# a refusal ("tenant: …"); in prose ("of tenant acme") it is a word.
_DOTTED = "|".join(re.escape(n) for n in sorted(FLAGS, key=len, reverse=True) if "." in n)
_PLAIN = "|".join(re.escape(n) for n in FLAGS if "." not in n)
_FIELD = re.compile(rf"(?<![\w.\-\[])(?:(?P<name>{_DOTTED}|(?:{_PLAIN})(?=:))|{_LORA})"
                    r"(?![\w\[]|\.\w)(?P<said>: (?P<leaf>\w+) )?")


def _flag(match: re.Match[str]) -> str:
    name = match["name"]
    flag = FLAGS[name] if name else f"--lora #{int(match['lora']) + 1}"
    said = match["said"]
    if said is None:
        return flag
    leaf = (name or "").rsplit(".", 1)[-1]
    # "generate.num_frames: num_frames must be 4k+1" -> "--frames: must be 4k+1"
    return f"{flag}: " if match["leaf"] == leaf else f"{flag}{said}"


#: Fields a message names bare ("5 is more than num_inference_steps 4").
_BARE = re.compile(r"(?<![\w.\-])(num_inference_steps|num_frames)(?![\w:])")


def as_flags(message: str) -> str:
    """``message`` with every field an option of ``submit`` sets named by that option."""
    named = _FIELD.sub(_flag, message)
    return _BARE.sub(lambda m: FLAGS[f"generate.{m[1]}"], named)
