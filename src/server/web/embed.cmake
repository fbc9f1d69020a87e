# Turns a file into a C array definition, run at build time (cmake -DIN=file -DOUT=file.inc -P embed.cmake).
# The output holds the bytes followed by a terminating zero, so the array is also a C string.
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 16 bytes to a line (CMake's regular expressions have no {n} repeat, hence string(REPEAT)).
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}" "/* generated from ${IN} by embed.cmake: do not edit */\n${bytes}0x00\n")
