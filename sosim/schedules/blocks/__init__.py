"""The building blocks several systems share (issue 25): the driver that turns a recipe into a plan, the
layout, the weight / gradient / step blocks, the CPU optimizer, the ZeRO-3 pieces, activation offload, the
tuner knobs and DeepSpeed's key data. A system module (one system's recipe) sits a level up, in sosim/schedules/."""
