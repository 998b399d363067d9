# server/files/: input paths, MIME sniffing, base64, writing inputs, collecting outputs/.
mps_unit_test(test_files ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_files.c LIBS mps_files)
