# The chat page is compiled into the binary: index.html becomes index_html.inc in the build tree at build time,
# and web_asset.c includes it. Included from src/server/CMakeLists.txt after kiln_module(server ...).
set(KILN_WEB_INC ${CMAKE_CURRENT_BINARY_DIR}/web/index_html.inc)
add_custom_command(
  OUTPUT ${KILN_WEB_INC}
  COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_CURRENT_SOURCE_DIR}/web/index.html -DOUT=${KILN_WEB_INC}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/web/embed.cmake
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/web/index.html ${CMAKE_CURRENT_SOURCE_DIR}/web/embed.cmake
  COMMENT "Embedding the web chat page")
target_sources(kiln_server PRIVATE ${KILN_WEB_INC})
target_include_directories(kiln_server PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/web)
